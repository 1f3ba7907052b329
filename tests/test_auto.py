"""``method="auto"`` (:mod:`recompute.doors.auto`): the plan a user gets without flags, its goal, its
pricing (:mod:`recompute.pricing.steptime`, :class:`recompute.capture.timing.TimeCache`) and the meter that checks it
(:class:`recompute.capture.allocator.AllocatorMeter`)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from torch import nn

import recompute
from experiments import nets
from recompute.capture.allocator import AllocatorMeter
from recompute.doors.exactness import compare
from recompute.doors.measure import default_loss
from recompute.planners.registry import InfeasibleBudget
from recompute.doors.auto import MAX_TIME, choose
from recompute.pricing.schedule import canonical
from recompute.pricing.steptime import plain_time, step_time
from recompute.capture.timing import OpCall, TensorSpec, TimeCache, TimeModel
from recompute.rewrites.pipeline import with_in_place, with_late_recompute, with_peak_recompute


def _graph(name: str = "dropout", cost_model: str = "paper", **kwargs) -> recompute.Graph:
    model, inputs = nets.build(name, **kwargs)
    return recompute.trace(model, inputs, cost_model=cost_model, loss_fn=default_loss)


def _every_rewrite(g: recompute.Graph, allowance: float) -> list[tuple[str, recompute.Plan]]:
    """The bases auto starts from (vanilla, the time-centric DP at its smallest budget and at 8 budgets up
    to vanilla's peak, the memory-centric DP) under every subset of the rewrites, in their one order:
    late, at the peak (spending what the allowance leaves), in place."""
    vanilla, tc = recompute.plan(g, "vanilla"), recompute.plan(g, "approxdp", strategy="tc")
    bases = [("vanilla", vanilla), ("tc", tc), ("mc", recompute.plan(g, "approxdp", strategy="mc"))]
    bases += [(f"tc {j}", recompute.plan(g, "approxdp", strategy="tc", budget=tc.peak + (vanilla.peak - tc.peak) * j // 9))
              for j in range(1, 9)]
    out = []
    for (label, base), (late, peak, placed) in itertools.product(bases, itertools.product((False, True), repeat=3)):
        p = with_late_recompute(base, g, then_in_place=placed) if late else base
        if peak:
            left = allowance - step_time(g, (with_in_place(p, g) if placed else p).runs(g))
            if left < 0:
                continue
            p = with_peak_recompute(p, g, limit=left, then_in_place=placed)
        out.append((f"{label} late={late} peak={peak} in place={placed}", with_in_place(p, g) if placed else p))
    return out


@pytest.mark.parametrize("name, kwargs", [("dropout", {}), ("resblock", {}), ("skip", {}),
                                          ("unet", {"batch_size": 1, "input_size": 32})])
def test_the_default_holds_the_least_peak_within_its_time_allowance(name, kwargs):
    g = _graph(name, **kwargs)
    allowance = MAX_TIME * plain_time(g)
    p = recompute.plan(g, "auto")
    assert p.time_ratio <= MAX_TIME + 1e-9 and step_time(g, p.runs(g)) <= allowance
    fast = [(label, q) for label, q in _every_rewrite(g, allowance) if step_time(g, q.runs(g)) <= allowance]
    least = min(q.peak for _, q in fast)
    assert p.peak <= least, f"auto {p.peak} ({p.info['chosen']}) > {least}: " + ", ".join(
        label for label, q in fast if q.peak == least)
    # and it is the plain step where nothing saves memory within the time
    assert p.peak < recompute.plan(g, "vanilla").peak


def test_a_memory_budget_gets_the_least_time_that_fits():
    g = _graph("resblock")
    smallest = recompute.plan(g, "auto", max_time=10.0)
    vanilla = recompute.plan(g, "vanilla")
    budget = (smallest.peak + vanilla.peak) // 2
    p = recompute.plan(g, "auto", budget=budget)
    assert p.peak <= budget and p.budget == budget
    every = _every_rewrite(g, math.inf)
    fit = [step_time(g, q.runs(g)) for _, q in every if q.peak <= budget]
    assert p.time_ratio * plain_time(g) <= min(fit) + 1e-6
    with pytest.raises(InfeasibleBudget, match="smallest feasible budget for auto is"):
        recompute.plan(g, "auto", budget=smallest.peak // 2)


@pytest.mark.parametrize("max_time, error, match", [
    (0, ValueError, "finite number > 0"), (math.nan, ValueError, "finite number > 0"),
    (math.inf, ValueError, "finite number > 0"), ("1.3", TypeError, "expected type float"),
    (True, TypeError, "expected type float")])
def test_a_time_allowance_that_is_no_ratio_is_refused(max_time, error, match):
    with pytest.raises(error, match=match):
        recompute.plan(_graph("chain", depth=3), "auto", max_time=max_time)


def test_optimize_without_arguments_plans_auto_and_trains_bitwise():
    model, inputs = nets.build("dropout", seed=0)
    m = recompute.optimize(model, inputs)
    assert m.plan.method == "auto" and m.graph.cost_model == "measured" and m.plan.time_ratio <= MAX_TIME
    assert m.plan.recomputed() or m.plan.schedule.recomputations()
    assert compare(model, m, inputs).bitwise


def test_auto_leaves_the_rewrites_to_itself():
    model, inputs = nets.build("chain", depth=3)
    for flag in ("in_place", "recompute_late", "recompute_at_peak"):
        with pytest.raises(ValueError, match=f"method 'auto' chooses the schedule rewrites itself.*{flag}"):
            recompute.optimize(model, inputs, **{flag: True})
        with pytest.raises(ValueError, match=f"method 'auto' chooses the schedule rewrites itself.*{flag}"):
            recompute.backend(**{flag: False})
    # a planner of the paper's takes them, through both doors
    recompute.optimize(model, inputs, method="approxdp", in_place=True)
    recompute.backend("approxdp", strategy="mc", in_place=True, recompute_late=True)


def test_convolutions_are_split_where_the_peak_needs_it_and_bitwise():
    """U-Net's smallest step within the time peaks at a convolution backward; split there, the fused
    op's values (checked on random tensors of its shapes before the split is kept)."""
    model, inputs = nets.build("unet", batch_size=1, input_size=64, seed=0)
    traced = []

    def trace_at(split):
        traced.append(split)
        return recompute.trace(model, inputs, cost_model="paper", split_convolutions=split)

    g, p = choose(trace_at)
    unsplit = recompute.plan(recompute.trace(model, inputs, cost_model="paper"), "auto")
    assert traced[:2] == [False, True]
    assert p.info.get("split convolutions") and p.peak < unsplit.peak and p.time_ratio <= MAX_TIME
    assert compare(model, recompute.execute(g, p, model), inputs).bitwise
    _, none = choose(trace_at, split_convolutions=False)
    assert "split convolutions" not in none.info and traced[-1] is False


def test_step_time_is_the_sum_of_the_calls_that_run():
    g = _graph("resblock", cost_model="measured")
    tm = g.program.time_model
    p = with_in_place(recompute.plan(g, "approxdp", strategy="mc"), g)
    from recompute.capture.timing import schedule_calls

    assert step_time(g, p.runs(g)) == pytest.approx(tm.seconds(schedule_calls(g.program, p.runs(g))) * 1e9)
    assert plain_time(g) == step_time(g, canonical(g, [g.nodes]))
    paper = _graph("resblock")
    assert plain_time(paper) == 3 * int(paper.time.sum())  # the backward at twice the forward


def test_timings_are_cached_on_disk_per_device(tmp_path):
    x = TensorSpec((64, 64), (64, 1), torch.float32, "cpu")
    call = OpCall(torch.ops.aten.mm.default, (x, x), {})
    cache = TimeCache(tmp_path, torch.device("cpu"))
    first = TimeModel("cpu", repeats=1, cache=cache)
    first.measure([call])
    assert json.loads(cache.path.read_text())[call.key.op][call.key.args] == first.table[call.key]
    again = TimeModel("cpu", repeats=1, cache=TimeCache(tmp_path, torch.device("cpu")))
    again.measure([call])
    assert again.table[call.key] == first.table[call.key] and again.spent["measuring"] == 0.0
    blocked = tmp_path / "a file"
    blocked.write_text("")
    unwritable = TimeModel("cpu", repeats=1, cache=TimeCache(blocked, torch.device("cpu")))
    unwritable.measure([call])  # a cache that cannot be written leaves the timing in the process
    assert call.key in unwritable.table


def test_the_allocator_meter_sees_what_a_compiled_step_allocates():
    """Inductor's compiled code allocates its buffers outside PyTorch's dispatcher: a dispatch-level
    meter sees none of them, the CPU allocator (what ``measure(backend="cpu")`` reports) sees them all."""
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    x = torch.randn(64, 256)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    default_loss(compiled(x)).backward()  # compiles
    model.zero_grad(set_to_none=True)
    with AllocatorMeter() as meter:
        default_loss(compiled(x)).backward()
    model.zero_grad(set_to_none=True)
    got = recompute.measure(model, (x,), runner=compiled, backend="cpu", iterations=1, warmup=0)
    torch._dynamo.reset()
    grads = sum(p.numel() * 4 for p in model.parameters())
    hidden = 64 * 512 * 4  # the first layer's output, which the backward reads
    assert got.peak_bytes == meter.peak >= grads + hidden
    assert got.storage_peak_bytes < got.peak_bytes
