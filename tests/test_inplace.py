"""Ops run in place (``recompute.inplace``): a pointwise op writes into the storage of an input that
dies there, as eager PyTorch's in-place ReLUs do; the executor runs it, the simulator prices it."""

from __future__ import annotations

import torch

import recompute
from recompute.doors.exactness import compare
from recompute.core.fxnodes import out_overload
from recompute.capture.timing import schedule_calls
from recompute.doors.measure import default_loss, measure
from recompute.pricing.simulate import simulate
from recompute.rewrites.inplace import simulated_in_place

from .test_remat import _Bottlenecks
from recompute.rewrites.pipeline import with_in_place

aten = torch.ops.aten


def test_pointwise_ops_write_through_their_out_overloads():
    assert out_overload(aten.add.Tensor) == (aten.add.out, "out")
    assert out_overload(aten.threshold_backward.default) == (aten.threshold_backward.grad_input, "grad_input")
    # relu.out is a wrapper that computes relu into a new tensor and copies it: relu_ runs in place
    assert out_overload(aten.relu.default) == (aten.relu_.default, None)
    assert out_overload(aten.native_dropout_backward.default) is None  # such a wrapper, and no in-place variant
    # no pointwise op, one that draws random numbers, one that already writes, or several outputs
    for op in (aten.convolution.default, aten.cat.default, aten.native_dropout.default, aten.relu_.default,
               aten.native_batch_norm.default):
        assert out_overload(op) is None, op


def test_a_dense_block_runs_its_relus_and_gradient_sums_in_place_bitwise_at_the_simulated_peak():
    """torchvision's dense layers: each ReLU writes into the BatchNorm output it reads (which nothing
    else reads), each ReLU's backward into the gradient it reads; the step is bitwise plain training's
    and its measured peak the simulated one, below the out-of-place schedule's. An in-place op never
    writes into a value read later, a parameter or an input, nor into a tangent its caller holds."""
    torch.manual_seed(0)
    model, inputs = _Bottlenecks(), (torch.randn(2, 3, 16, 16),)
    g = recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)
    for method in ("vanilla", "chen"):
        p = recompute.plan(g, method)
        written = with_in_place(p, g)
        s = written.runs(g)
        targets = {s.steps[i][0]: g.program.joint.node(s.steps[i][0]).target for i in s.into}
        assert aten.relu.default in targets.values() and aten.threshold_backward.default in targets.values()
        assert written.peak < p.peak and written.peak == simulate(g.program, s).peak
        runner = recompute.execute(g, written, model)
        assert measure(model, inputs, runner=runner, backend="fake").peak_bytes == written.peak
        assert compare(model, runner, inputs).bitwise
        last_read = {r: i for i, reads in enumerate(s.reads) for r in reads}
        placeholders = {n.name for n in g.program.joint.gm.graph.nodes if n.op == "placeholder"}
        for step, target in s.into.items():
            assert last_read[target] == step and target[0] not in placeholders
        # the time model prices each step as it runs: relu_ and threshold_backward.grad_input, no new output
        plain, calls = schedule_calls(g.program, p.runs(g)), schedule_calls(g.program, s)
        assert len(calls) == len(plain) and aten.relu.default not in {c.target for c in calls}
        assert {aten.relu_.default, aten.threshold_backward.grad_input} <= {c.target for c in calls}
    conv = recompute.trace(torch.nn.Conv2d(3, 4, 3), inputs)  # no pointwise op: nothing in place
    vanilla = recompute.plan(conv, "vanilla")
    assert not with_in_place(vanilla, conv).runs(conv).into and with_in_place(vanilla, conv).peak == vanilla.peak


def test_the_lifetimes_found_while_writing_in_place_are_those_of_the_schedule_it_makes():
    """:func:`simulated_in_place` prices a schedule from the lifetimes :func:`in_place` tracks as it
    chooses the writes (a search judges thousands of schedules): they equal ``lifetimes()`` of the
    schedule it returns, storage by storage, on plans whose values are computed more than once too."""
    from recompute.pricing.simulate import lifetimes
    from recompute.rewrites.inplace import _written
    from recompute.rewrites.peak import recompute_at_peak

    torch.manual_seed(0)
    g = recompute.trace(_Bottlenecks(), (torch.randn(2, 3, 16, 16),), loss_fn=default_loss, workspaces=False)
    p, checked = g.program, 0
    for method, strategy in (("vanilla", None), ("chen", None), ("approxdp", "tc"), ("approxdp", "mc")):
        s = recompute.plan(g, method, strategy=strategy).runs(g)
        for schedule in (s, recompute_at_peak(g, s)):
            written, life = _written(p, schedule)
            want = lifetimes(p, written)
            assert written.into and life.creates == want.creates and life.last == want.last
            assert life.tangents == want.tangents and life.moved == want.moved
            assert simulated_in_place(p)(schedule).live.tolist() == simulate(p, written).live.tolist()
            checked += 1
    assert checked == 8
