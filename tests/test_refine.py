"""Plans between the two canonical strategies (:mod:`benchmarks.refining`) against brute force, and the
late recomputations judged on the step run in place."""

import itertools
from functools import lru_cache

import pytest
import torch
from torchvision.models.densenet import _DenseBlock as _TorchvisionDenseBlock

import recompute
from recompute.core import lowerset
from experiments import nets
from recompute.rewrites.inplace import in_place
from benchmarks.refining import nested_runs, refine, step_peak
from recompute.rewrites.remat import _fewest_late, late_where_needed, recompute_late
from recompute.pricing.simulate import simulate

from .exactness import check_plans
from recompute.rewrites.pipeline import with_rewrites


@lru_cache(maxsize=None)  # each network traced once per module
def _planned(name: str) -> tuple[torch.nn.Module, tuple, recompute.Graph, recompute.Plan, recompute.Plan]:
    model, inputs = nets.build(name, batch_size=2, input_size=32, seed=0)
    g = recompute.trace(model, inputs, workspaces=False)
    return model, inputs, g, *(recompute.plan(g, "approxdp", strategy=s) for s in ("tc", "mc"))


def _every_refinement(g: recompute.Graph, mc: recompute.Plan, tc: recompute.Plan) -> list[tuple[int, int]]:
    """(step peak, overhead) of ``mc``'s sequence with each subset of ``tc``'s nested sets inserted."""
    fine = [x for _, run in nested_runs(mc.lower_sets, tc.lower_sets) for x in run]
    out = []
    for k in range(len(fine) + 1):
        for subset in itertools.combinations(fine, k):
            seq = sorted([*mc.lower_sets, *subset], key=len)
            out.append((step_peak(g, seq), lowerset.overhead(g, seq)))
    return out


@pytest.mark.parametrize("name", ["resblock", "cross_modal"])
def test_refining_the_memory_centric_plan_finds_the_least_overhead_within_each_peak(name):
    """At every peak some refinement reaches, the greedy search inserts the time-centric plan's
    nested lower sets that a brute force over all their subsets finds cheapest; below the
    memory-centric plan's own peak there is none, and the error names that peak. Each result is a
    lower-set sequence whose step, as the executor runs it (late recomputation where it lowers the
    peak, in place), holds its limit."""
    _, _, g, tc, mc = _planned(name)
    assert nested_runs(mc.lower_sets, tc.lower_sets), "the two strategies share no block to refine"
    every = _every_refinement(g, mc, tc)
    own = step_peak(g, mc.lower_sets)
    with pytest.raises(recompute.InfeasibleBudget, match=f"smallest feasible budget for approxdp refined is {own} bytes"):
        refine(g, mc, tc, own - 1)
    for limit in sorted({peak for peak, _ in every}):
        got = refine(g, mc, tc, limit)
        assert set(mc.lower_sets) <= set(got.lower_sets)
        assert got.overhead == min(cost for peak, cost in every if peak <= limit), limit
        run = with_rewrites(got, g, recompute_late=True, in_place=True)
        assert step_peak(g, got.lower_sets) <= limit and run.peak <= limit
    assert got.overhead < mc.overhead and got.info["refined with"] > 0  # the largest limit inserts something


def test_a_refined_plan_trains_as_plain_training_does():
    """The refined plan, run late and in place, computes plain training's step bitwise."""
    model, inputs, g, tc, mc = _planned("resblock")
    got = refine(g, mc, tc, 2**40)
    assert got.overhead < mc.overhead
    run = with_rewrites(got, g, recompute_late=True, in_place=True)
    check_plans(model, inputs, [lambda _: run], dtype=torch.float32, graph=g)


def test_late_recomputations_judged_in_place_are_those_the_step_run_in_place_needs():
    """Recomputing every cheap value late can raise the peak of the step run in place (the copies
    meet at its peak): on the cross-modal network both plans' steps in place hold more with every late
    recomputation than with none, and for a step run in place :func:`late_where_needed` adds none."""
    _, _, g, tc, mc = _planned("cross_modal")
    p = g.program
    for plan in (mc, recompute.plan(g, "chen")):
        s = plan.runs(g)
        none, every = (simulate(p, in_place(p, x)).peak for x in (s, recompute_late(p, s)))
        assert every > none
        judged = late_where_needed(p, s, written_in_place=True)
        assert judged is s
        assert with_rewrites(plan, g, recompute_late=True, in_place=True).peak == none


class _DenseNet(torch.nn.Module):
    """``blocks`` small dense blocks (torchvision's) with DenseNet's transitions between them."""

    def __init__(self, layers: int, blocks: int, growth: int = 8):
        super().__init__()
        mods: list[torch.nn.Module] = [torch.nn.Conv2d(3, 16, 3, padding=1)]
        c = 16
        for b in range(blocks):
            mods.append(_TorchvisionDenseBlock(layers, c, bn_size=4, growth_rate=growth, drop_rate=0.0))
            c += layers * growth
            if b < blocks - 1:
                mods += [torch.nn.BatchNorm2d(c), torch.nn.ReLU(), torch.nn.Conv2d(c, c // 2, 1), torch.nn.AvgPool2d(2)]
                c //= 2
        self.body, self.head = torch.nn.Sequential(*mods), torch.nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


def test_late_recomputations_for_a_step_run_in_place_hold_the_least_of_both_searches():
    """On three dense blocks of 8 layers (batch 1, 32²), the late recomputations searched judging the
    step run in place hold less than those searched as planned for the time-centric plan, and more
    for the memory-centric one: ``late_where_needed(written_in_place=True)`` runs both and keeps the
    lower."""
    torch.manual_seed(0)
    model, inputs = _DenseNet(8, 3), (torch.randn(1, 3, 32, 32),)
    g = recompute.trace(model, inputs, workspaces=False)
    p = g.program

    def placed(x):
        return simulate(p, in_place(p, x))

    for strategy in ("tc", "mc"):
        plan = recompute.plan(g, "approxdp", strategy=strategy)
        s = plan.runs(g)
        as_planned, judged_in_place = (placed(_fewest_late(p, s, 8, f)).peak for f in (lambda x: simulate(p, x), placed))
        assert (judged_in_place < as_planned) if strategy == "tc" else (as_planned < judged_in_place)
        both = with_rewrites(plan, g, recompute_late=True, in_place=True)
        assert both.peak == min(as_planned, judged_in_place) == simulate(p, both.runs(g)).peak


def test_the_refine_benchmark_prints_each_plan_as_the_executor_runs_it():
    """``benchmarks.refine`` end to end on a tiny network: a row per plan, the refined one within its
    limit and recomputing less than the memory-centric one."""
    from benchmarks import refine as bench

    rows = bench.run("resblock", 2, 32, [1.0])
    labels = [r[0] for r in rows]
    assert labels == ["time-centric", "memory-centric", "every nested set inserted", "refined within 1 GiB"]
    by = dict(zip(labels, rows))
    assert float(by["refined within 1 GiB"][1]) <= 1.0
    assert by["refined within 1 GiB"][2] < by["memory-centric"][2]
