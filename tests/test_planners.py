"""Planners against the exhaustive oracle (§4.1) on small random DAGs, and hand-checked shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import recompute
from recompute.core import lowerset
from recompute.core.graph import Graph
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import InfeasibleBudget, Plan, methods
from recompute.core.lowerset import split_candidates
from recompute.core.families import TooManyLowerSets

from .strategies import chain, dags, fig2_skip, ladder, siamese

DPS = ("exactdp", "approxdp")
FAST = settings(max_examples=60, deadline=None)
ORACLE = settings(max_examples=80, deadline=None)  # the exhaustive search is exponential: ≤ 10 nodes


def budget_between(g: Graph, low: int, frac: float) -> int:
    """A budget in [low, 2 M(V)] (2 M(V) is vanilla's eq. (2) peak)."""
    return low + int(frac * (2 * g.total_mem() - low))


def assert_valid(g: Graph, p: Plan) -> None:
    lowerset.check_sequence(g, p.lower_sets)  # strictly increasing lower sets ending at V
    assert p.peak == MemoryModel.paper.peak(g, p.lower_sets)
    assert p.overhead == lowerset.overhead(g, p.lower_sets)
    if p.budget is not None:
        assert p.peak <= p.budget


# --- against the oracle ---------------------------------------------------------------------------


@ORACLE
@given(dags(max_nodes=10), st.floats(0, 1), st.sampled_from(["tc", "mc"]))
def test_exactdp_matches_exhaustive(g: Graph, frac: float, strategy: str) -> None:
    oracle = recompute.plan(g, "exhaustive", strategy=strategy)
    dp = recompute.plan(g, "exactdp", strategy=strategy)
    assert dp.budget == oracle.budget  # the smallest feasible budget B*
    assert dp.overhead == oracle.overhead
    budget = budget_between(g, oracle.budget, frac)
    oracle = recompute.plan(g, "exhaustive", strategy=strategy, budget=budget)
    dp = recompute.plan(g, "exactdp", strategy=strategy, budget=budget)
    assert dp.overhead == oracle.overhead  # tc: the least overhead; mc: the most
    assert_valid(g, dp)
    assert_valid(g, oracle)


@ORACLE
@given(dags(max_nodes=9), st.floats(0, 1), st.sampled_from(["tc", "mc"]), st.randoms(use_true_random=False))
def test_liveness_model_exactdp_matches_exhaustive(g: Graph, frac: float, strategy: str, rnd) -> None:
    # S_v ≤ M_v: what autograd keeps of each output
    g.saved = np.array([rnd.randint(0, int(m)) for m in g.mem], dtype=np.int64)
    kw = {"strategy": strategy, "memory_model": "liveness"}
    oracle = recompute.plan(g, "exhaustive", **kw)
    dp = recompute.plan(g, "exactdp", **kw)
    assert dp.budget == oracle.budget and dp.overhead == oracle.overhead
    vanilla = MemoryModel.liveness.peak(g, [g.nodes])
    assert oracle.budget <= vanilla
    budget = oracle.budget + int(frac * (vanilla - oracle.budget))
    oracle = recompute.plan(g, "exhaustive", budget=budget, **kw)
    for method in DPS:
        try:
            plan = recompute.plan(g, method, budget=budget, **kw)
        except InfeasibleBudget as err:  # the pruned family may need more than the exact B*
            assert method == "approxdp" and err.min_budget > budget
            continue
        lowerset.check_sequence(g, plan.lower_sets)
        assert plan.peak == MemoryModel.liveness.peak(g, plan.lower_sets) <= budget
        if method == "exactdp":
            assert plan.overhead == oracle.overhead
        elif strategy == "tc":
            assert plan.overhead >= oracle.overhead
    with pytest.raises(InfeasibleBudget) as err:
        recompute.plan(g, "exactdp", budget=dp.budget - 1, **kw)
    assert err.value.min_budget == dp.budget


# --- properties of the DPs ------------------------------------------------------------------------


@FAST
@given(dags(), st.floats(0, 1))
def test_dp_plans_valid_and_ordered(g: Graph, frac: float) -> None:
    exact_min = recompute.plan(g, "exactdp")
    approx_min = recompute.plan(g, "approxdp")
    assert exact_min.budget == exact_min.min_budget <= approx_min.budget  # {L_v} is a subfamily
    budget = budget_between(g, approx_min.budget, frac)
    plans = {(m, s): recompute.plan(g, m, strategy=s, budget=budget) for m in DPS for s in ("tc", "mc")}
    for p in plans.values():
        assert_valid(g, p)
        assert p.budget == budget
    for m in DPS:
        assert plans[m, "mc"].overhead >= plans[m, "tc"].overhead
    assert plans["approxdp", "tc"].overhead >= plans["exactdp", "tc"].overhead
    assert plans["approxdp", "mc"].overhead <= plans["exactdp", "mc"].overhead


@FAST
@given(dags(), st.sampled_from(DPS), st.sampled_from(["tc", "mc"]))
def test_min_budget_is_tight(g: Graph, method: str, strategy: str) -> None:
    best = recompute.plan(g, method, strategy=strategy)
    assert_valid(g, best)
    assert best.peak == best.budget  # nothing fits below B*, so the plan at B* reaches it
    with pytest.raises(InfeasibleBudget) as err:
        recompute.plan(g, method, strategy=strategy, budget=best.budget - 1)
    assert err.value.min_budget == best.budget
    assert err.value.budget == best.budget - 1


@FAST
@given(dags())
def test_vanilla_budget(g: Graph) -> None:
    vanilla = recompute.plan(g, "vanilla")
    assert vanilla.peak == 2 * g.total_mem() and vanilla.overhead == 0
    for m in DPS:
        tc = recompute.plan(g, m, strategy="tc", budget=vanilla.peak)
        assert tc.overhead == 0 and tc.peak <= vanilla.peak
        # The overhead cannot exceed one forward pass without the last block.
        mc = recompute.plan(g, m, strategy="mc", budget=vanilla.peak)
        assert mc.overhead <= g.total_time() - sum(int(g.time[v]) for v in mc.blocks[-1])


@FAST
@given(dags(), st.sampled_from(["chen", "chen_greedy"]))
def test_chen_plans_valid(g: Graph, method: str) -> None:
    p = recompute.plan(g, method)
    assert_valid(g, p)
    pruned = lowerset.pruned_lower_sets(g)
    cands = set(split_candidates(g))
    assert cands == {v for v in range(g.n) if lowerset.boundary(g, pruned[v]) == {v} and g.preds[v]}


@FAST
@given(dags())
def test_boundaries_are_the_boundaries_of_the_pruned_family(g: Graph) -> None:
    pruned = lowerset.pruned_lower_sets(g)
    b = lowerset.boundaries(g)
    assert all(set(np.flatnonzero(b[:, v]).tolist()) == lowerset.boundary(g, pruned[v]) for v in range(g.n))
    assert lowerset.boundary_bytes(g).tolist() == [sum(int(g.mem[u]) for u in lowerset.boundary(g, s)) for s in pruned]


# --- hand-checked shapes --------------------------------------------------------------------------


def test_chain_min_budget_is_sublinear() -> None:
    g = chain(16)
    vanilla = recompute.plan(g, "vanilla")
    for m in DPS:
        p = recompute.plan(g, m)
        # On a chain the exact optimum over eq. (2): blocks of decreasing length, each cached
        # boundary paid for by a shorter later block; the peak is O(√n) instead of 2n.
        assert p.peak == 9 and vanilla.peak == 32
        assert 4 <= p.k <= 8
        assert all(len(b) <= 4 for b in p.blocks)
    c = recompute.plan(g, "chen")
    assert c.k == 4 and c.peak < vanilla.peak  # √16 segments
    assert [len(b) for b in c.blocks] == [4, 4, 4, 4]


def test_fig2_skip_has_dp_plan_but_no_chen_split() -> None:
    g = fig2_skip(8)
    assert split_candidates(g) == []
    vanilla = recompute.plan(g, "vanilla")
    for method in ("chen", "chen_greedy"):
        p = recompute.plan(g, method)
        assert p.k == 1 and p.peak == vanilla.peak
    for m in DPS:
        p = recompute.plan(g, m)
        assert p.k > 1 and p.peak < vanilla.peak
        assert all(0 in lowerset.boundary(g, lower) for lower in p.lower_sets[:-1])  # the skip keeps v0


def test_siamese_exact_beats_approx_family() -> None:
    # Two parallel branches: the exact family can stop part-way into both, {L_v} cannot.
    g = siamese(4, mem=[4, 4, 4, 4, 4, 4, 4, 4, 1])
    exact, approx = recompute.plan(g, "exactdp"), recompute.plan(g, "approxdp")
    assert exact.budget < approx.budget
    assert exact.info["lower_sets"] == 5 * 5 + 1 and approx.info["lower_sets"] == 9 + 1


def test_too_many_lower_sets() -> None:
    g = Graph.from_edges([], [1] * 12, [1] * 12)  # no edges: all 2^12 subsets are lower sets
    with pytest.raises(TooManyLowerSets, match=r"max_lower_sets=100 .*\(\d+ found") as err:
        recompute.plan(g, "exactdp", max_lower_sets=100)
    assert err.value.count > 100 and str(err.value.count) in str(err.value)
    assert recompute.plan(g, "exactdp", max_lower_sets=5000).info["lower_sets"] == 4096


def test_time_quantisation_keeps_exact_overhead() -> None:
    g = chain(40, mem=[3] * 40, time=[10**9 + 7 * i for i in range(40)])
    p = recompute.plan(g, "exactdp", time_levels=100)
    q = p.info["time_quantum"]
    assert q == math.ceil(g.total_time() / 100)
    assert_valid(g, p)
    assert abs(p.info["dp_overhead"] - p.overhead) <= q * p.k  # ≤ ½ quantum of rounding per block


def test_registered_and_errors() -> None:
    assert {"exactdp", "approxdp", "exhaustive", "chen", "chen_greedy", "vanilla"} <= set(methods())
    with pytest.raises(ValueError, match="strategy"):
        recompute.plan(chain(3), "exactdp", strategy="fastest")
    with pytest.raises(InfeasibleBudget):
        recompute.plan(chain(3), "chen", budget=1)


def test_graphs_of_one_program_with_other_costs_plan_with_their_own():
    """The DPs keep their lower-set families on the traced program; a graph of the same program priced by
    another cost model (``dataclasses.replace(g, time=...)``) must not be planned with the first one's
    sums (it was: every budget infeasible, or another graph's optimum; on ``skip``, another optimum)."""
    from dataclasses import replace

    from experiments import nets

    def trace():
        model, inputs = nets.build("skip", seed=0, fake_inputs=True)
        return recompute.trace(model, inputs, cost_model="flops")

    g = trace()
    other = np.random.default_rng(0).integers(1, 10**6, g.n)
    fresh = recompute.plan(replace(trace(), time=other), "approxdp", strategy="tc")
    recompute.plan(g, "approxdp", strategy="tc")  # the family of the flops costs, kept on the program
    again = recompute.plan(replace(g, time=other), "approxdp", strategy="tc")
    assert again.lower_sets == fresh.lower_sets and again.overhead == fresh.overhead


def test_chen_least_boundary_cuts_an_unrolled_rnn() -> None:
    g = ladder(32)  # Chen et al. §5.3: an LSTM has no articulation node to end a segment at
    vanilla = recompute.plan(g, "vanilla")
    assert recompute.plan(g, "chen").k == 1
    p = recompute.plan(g, "chen", cuts="least_boundary")
    assert_valid(g, p)
    assert p.k > 4 and p.peak < vanilla.peak / 2
    assert all(len(lowerset.boundary(g, s)) == 2 for s in p.lower_sets[:-1])  # each cut holds the two states


def test_chen_rejects_an_unknown_cut() -> None:
    with pytest.raises(ValueError, match="cuts='bridges' is not one of 'articulation', 'least_boundary'"):
        recompute.plan(chain(4), "chen", cuts="bridges")
