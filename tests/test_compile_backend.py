"""``torch.compile(model, backend=recompute.backend(...))``: our plan partitions AOTAutograd's joint graph.

Two SGD steps of the compiled model against two of the plain one, from the same weights, buffers and
generator states: loss, parameter gradients, BatchNorm statistics (written once) and the generator
state after the step are bitwise equal on the eager runtime (dropout masks equal eager's).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.partitioners import default_partition

import recompute
from experiments import nets
from recompute.doors.backend import activation_bytes
from recompute.core.fxnodes import is_random

from .exactness import compiled_like_plain, sgd_steps
from .models import LiteralConstant


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # every test compiles its own model with its own backend
    yield
    torch._dynamo.reset()


def _assert_trains_like_eager(name: str, bitwise: bool = True, **options: Any) -> recompute.doors.backend.Backend:
    model, (x,) = nets.build(name, batch_size=4, input_size=8, seed=0)
    plain, compiled = copy.deepcopy(model), copy.deepcopy(model)
    backend = recompute.backend(**options)
    ref = sgd_steps(plain, plain, (x,))
    got = sgd_steps(compiled, torch.compile(compiled, backend=backend), (x,))
    for step, (a, b) in enumerate(zip(ref, got)):
        assert a.keys() == b.keys()
        for key in a:
            if bitwise:
                assert torch.equal(a[key], b[key]), f"step {step}: {key}"
            else:
                torch.testing.assert_close(b[key], a[key], msg=lambda m: f"step {step}: {key}: {m}")
    assert backend.partitions, "the backend partitioned no joint graph"
    return backend


@pytest.mark.parametrize("method", ["approxdp", "chen"])
def test_batchnorm_net_trains_exactly(method):
    backend = _assert_trains_like_eager("resblock", method=method)
    assert backend.partitions[-1].plan.recomputed(), "the plan recomputes nothing: the test shows nothing"


def test_dropout_net_trains_exactly():
    """Dropout inside recomputed blocks: the masks are the forward's (random ops are saved, never
    recomputed), drawn in eager's order; BatchNorm statistics written once."""
    backend = _assert_trains_like_eager("dropout", method="chen")
    part = backend.partitions[-1]
    joint = part.graph.program.joint
    random = [n for n in joint.forward if is_random(n)]
    assert random and all(n.name not in {name for name, copy in part.schedule.steps if copy > 0} for n in random)
    assert part.plan.recomputed()


def _default_saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Activation bytes torch's default partition saves for the same graph."""
    seen: list[int] = []

    def partition(joint, inputs, *, num_fwd_outputs, **kw):
        fw, bw = default_partition(joint, inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        seen.append(activation_bytes(fw.graph.find_nodes(op="output")[0].args[0][num_fwd_outputs:]))
        return fw, bw

    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=boxed_nop, partition_fn=partition))
    compiled(x).sum().backward()
    return seen[-1]


def test_saves_fewer_activations_than_default_partition():
    """A memory-centric plan saves less than torch's default partition, and its recomputation runs
    block by block inside the backward module (after backward ops), not all up front."""
    model, (x,) = nets.build("chain", batch_size=4, input_size=16, seed=0, depth=10)
    backend = recompute.backend("approxdp", strategy="mc")
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    compiled(x).sum().backward()
    part = backend.partitions[-1]
    torch._dynamo.reset()
    default = _default_saved_bytes(copy.deepcopy(model), x)
    assert 0 < part.saved_bytes < 0.75 * default, (part.saved_bytes, default)
    ops = [n for n in part.backward.graph.nodes if n.op == "call_function"]
    first_recomputed = next(i for i, n in enumerate(ops) if n.meta.get("partitioner_tag") == "is_forward")
    assert any(n.meta.get("partitioner_tag") == "is_backward" for n in ops[:first_recomputed])


@pytest.mark.parametrize("kwargs, error, match", [
    ({"method": "nosuch"}, ValueError, "unknown method 'nosuch'"),
    ({"method": "approxdp", "strategy": "fast"}, ValueError, "unknown strategy 'fast'"),
    ({"method": "chen", "segments": 3}, TypeError, "has no option 'segments'"),
    ({"method": "torch_checkpoint_blocks"}, ValueError, "not a planner"),
    ({"method": "approxdp", "runtime": "tvm"}, ValueError, "unknown runtime 'tvm'"),
    ({"method": "approxdp", "budget": -1}, ValueError, "budget must be a positive"),
    ({"method": "approxdp", "cost_model": "guess"}, ValueError, "unknown cost_model 'guess'"),
    ({"method": "approxdp", "split_convolutions": "yes"}, TypeError, "split_convolutions must be True or False"),
])
def test_bad_options_fail_before_compiling(kwargs, error, match):
    with pytest.raises(error, match=match):
        recompute.backend(**kwargs)


def test_infeasible_budget_names_the_smallest():
    model, (x,) = nets.build("chain", batch_size=2, input_size=8, seed=0, depth=4)
    compiled = torch.compile(model, backend=recompute.backend("approxdp", budget=1))
    with pytest.raises(Exception, match="smallest feasible budget"):
        compiled(x)


def test_dynamic_shapes_are_refused():
    model, (x,) = nets.build("chain", batch_size=2, input_size=8, seed=0, depth=2)
    compiled = torch.compile(model, backend=recompute.backend("chen"), dynamic=True)
    with pytest.raises(Exception, match="static shapes only"):
        compiled(x)


@pytest.mark.slow
def test_inductor_runtime_trains_dropout_batchnorm_net_like_eager():
    """Inductor compiles the two modules of our partition (C++ on the CPU: about a minute); its fused
    kernels round differently, so equal within ``assert_close``. Its dropout draws eager's masks only
    with ``fallback_random``; inductor's decomposition draws Dropout2d's mask into an ``empty`` tensor,
    which must stay in V, not run up front."""
    import torch._inductor.config

    with torch._inductor.config.patch(fallback_random=True):
        backend = _assert_trains_like_eager("dropout", bitwise=False, method="approxdp", strategy="mc",
                                            runtime="inductor")
    assert backend.partitions[-1].plan.recomputed()


def test_constants_the_forward_makes_reach_both_modules():
    torch.manual_seed(0)
    model, x = LiteralConstant(), torch.randn(3, 4)
    compiled_like_plain(model, (x,), {"chen": recompute.backend("chen")})


def test_identical_ops_run_once():
    """Like PyTorch's partitioners, the backend merges identical pure ops of the joint graph (and drops
    dead ones) before it plans: the step computes sin(x) once, and still trains like eager."""

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            return torch.sin(h) * torch.sin(h)

    model, x = Twice(), torch.randn(3, 4)
    backend = recompute.backend("vanilla")
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    got = compiled(x)
    got.sum().backward()
    part = backend.partitions[-1]
    sines = [n for g in (part.forward, part.backward) for n in g.graph.nodes if n.target is torch.ops.aten.sin.default]
    assert len(sines) == 1
    assert torch.equal(got, model(x))


class _Convs(torch.nn.Module):
    """Three convolutions in a row (the second strided over an odd size, so its input gradient needs
    an output padding; the third grouped and dilated): the second's and third's inputs are read by
    nothing else of the backward."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1, stride=2)
        self.c = torch.nn.Conv2d(32, 8, 3, padding=1, dilation=2, groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


def test_split_convolutions_runs_a_convolution_backward_as_two_ops_and_frees_its_input_between():
    """The weight's gradient first, then the input's as a transposed convolution: training is bitwise
    eager's, and the convolution's input is freed before the input's gradient is made (lower peak)."""
    torch.manual_seed(0)
    model, x = _Convs(), torch.randn(2, 3, 17, 17)
    parts = compiled_like_plain(model, (x,), {split: recompute.backend("vanilla", split_convolutions=split)
                                              for split in (False, True)})
    calls = [n for n in parts[True].backward.graph.nodes if n.op == "call_function"]
    assert not any(n.target is torch.ops.aten.convolution_backward.default and n.args[-1][0] for n in calls)
    assert sum(n.target is torch.ops.aten.convolution.default and n.args[6] for n in calls) == 2  # b's and c's
    assert parts[True].peak < parts[False].peak
