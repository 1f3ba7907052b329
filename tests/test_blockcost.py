"""The DPs price a block with the simulator: B(L, L′) of :mod:`recompute.pricing.blockcost` gives the simulated
peak of every canonical strategy, so exactdp is exact for the program that runs."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import recompute
from recompute.core import lowerset
from experiments import nets
from recompute.pricing.blockcost import BlockCosts
from recompute.doors.measure import default_loss
from recompute.planners.exhaustive import lower_sets
from recompute.pricing.schedule import canonical, rng_order_preds
from recompute.pricing.simulate import simulate

from .models import RandomDAGNet


def _order(graph: recompute.Graph) -> recompute.Graph:
    """G with random ops chained in traced order: the lower sets the DPs search."""
    return recompute.Graph(rng_order_preds(graph), graph.mem, graph.time, graph.names, graph.ops, graph.outputs)


def _random_sequences(graph: recompute.Graph, rng: random.Random, count: int) -> list[list[frozenset[int]]]:
    """Random increasing sequences of unions of L_v (of the DPs' order) ending at V."""
    family = lowerset.pruned_lower_sets(_order(graph))
    out = [[graph.nodes]]
    for _ in range(count):
        seq, current = [], frozenset()
        for lower in rng.sample(family, k=rng.randint(1, min(8, len(family)))):
            current |= lower
            if not seq or current != seq[-1]:
                seq.append(current)
        out.append(seq if seq[-1] == graph.nodes else [*seq, graph.nodes])
    return out


def _agree(graph: recompute.Graph, seqs) -> None:
    costs = BlockCosts.build(graph)
    assert costs is not None, "every op of this graph's backward reads its owner's values or its inputs'"
    for seq in seqs:
        bd = [lowerset.boundary(graph, lower) for lower in seq]
        assert costs.peak(seq, bd) == simulate(graph.program, canonical(graph, seq)).peak


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_block_costs_equal_the_simulator_on_random_models(seed):
    graph = recompute.trace(RandomDAGNet(seed), (torch.randn(2, 4, 6, 6),), loss_fn=default_loss)
    # a trace whose backward reads other values (a mis-owned op) is planned with another model
    assume(BlockCosts.build(graph) is not None)
    _agree(graph, _random_sequences(graph, random.Random(seed), 6))


@pytest.mark.parametrize("name", ["chain", "skip", "resblock", "dropout", "siamese"])
def test_block_costs_equal_the_simulator_on_the_zoo(name):
    # ResNet-50 and GoogLeNet: tests/test_workspace.py, without workspaces and with them (one trace)
    model, inputs = nets.build(name, fake_inputs=True)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    _agree(graph, _random_sequences(graph, random.Random(0), 10))


def _sequences(graph: recompute.Graph):
    """Every strictly increasing sequence of lower sets (of the DPs' order) ending at V."""
    lowers = [s for s in lower_sets(_order(graph)) if s]
    def extend(prefix):
        if prefix and prefix[-1] == graph.nodes:
            yield list(prefix)
            return
        for s in lowers:
            if not prefix or prefix[-1] < s:
                yield from extend(prefix + [s])
    yield from extend([])


def _small_graph(seed: int, nodes: int = 2) -> recompute.Graph:
    return recompute.trace(RandomDAGNet(seed, nodes=nodes), (torch.randn(1, 4, 4, 4),), loss_fn=default_loss)


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_exactdp_equals_the_brute_force_under_the_simulator(seed):
    graph = _small_graph(seed)
    assert graph.n <= 10  # the brute force walks every sequence
    found = [(simulate(graph.program, canonical(graph, seq)).peak, lowerset.overhead(graph, seq)) for seq in
             _sequences(graph)]
    smallest = min(peak for peak, _ in found)
    for budget in (smallest, (smallest + max(p for p, _ in found)) // 2):
        fits = [t for peak, t in found if peak <= budget]
        tc = recompute.plan(graph, "exactdp", strategy="tc", budget=budget)
        mc = recompute.plan(graph, "exactdp", strategy="mc", budget=budget)
        assert tc.memory_model == "simulator" and tc.peak <= budget and mc.peak <= budget
        assert tc.overhead == min(fits) and mc.overhead == max(fits)
    assert recompute.plan(graph, "exactdp").peak == smallest
    with pytest.raises(recompute.InfeasibleBudget) as err:
        recompute.plan(graph, "exactdp", budget=smallest - 1)
    assert err.value.min_budget == smallest


@pytest.mark.parametrize("name", ["resblock", "siamese"])
def test_exactdp_is_never_worse_than_approxdp(name):
    model, inputs = nets.build(name)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    for strategy in ("tc", "mc"):
        exact = recompute.plan(graph, "exactdp", strategy=strategy)
        approx = recompute.plan(graph, "approxdp", strategy=strategy)
        assert exact.peak <= approx.peak
        budget = max(exact.peak, approx.peak)
        if strategy == "tc":
            assert (recompute.plan(graph, "exactdp", strategy="tc", budget=budget).overhead
                    <= recompute.plan(graph, "approxdp", strategy="tc", budget=budget).overhead)


def test_dp_peak_is_the_measured_peak():
    model, inputs = nets.build("resblock")
    graph = recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)
    for method in ("approxdp", "exactdp"):
        p = recompute.plan(graph, method, strategy="tc")
        got = recompute.measure(model, inputs, runner=recompute.execute(graph, p), backend="fake").peak_bytes
        assert p.peak == got
