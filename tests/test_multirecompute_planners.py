"""The registered planners that recompute more than once (``revolve``, ``chen_recursive``, ``join_dp``):
``recompute.plan`` returns a plan with an executable schedule that trains exactly, whose ``peak`` is the
measured one, and whose slot count is searched against a budget."""

from __future__ import annotations

import copy

import pytest
import torch

import recompute
from experiments import nets
from recompute.core.graph import Graph
from recompute.doors.measure import default_loss, measure
from recompute.planners.pebble import c_min, c_opt, join_of
from recompute.planners.registry import spec

from .exactness import assert_same, check_plan, train_step

TINY = dict(batch_size=2, input_size=8, seed=0, L=1, width=4, embed=8)
CASES = [("revolve", "chain", {}), ("chen_recursive", "chain", {}), ("join_dp", "cross_modal", TINY),
         ("join_dp", "snn", TINY)]


def _traced(name: str, build: dict):
    """The float64 model, its inputs, plain training's step and the step traced with its loss."""
    model, inputs = nets.build(name, **build)
    model, inputs = model.double(), tuple(x.double() for x in inputs)
    plain = copy.deepcopy(model)
    ref = train_step(plain, plain, inputs, 0)
    return model, inputs, ref, recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)


@pytest.mark.parametrize("method, name, build", CASES)
def test_planner_trains_exactly_at_the_measured_peak(method: str, name: str, build: dict) -> None:
    model, inputs, ref, graph = _traced(name, build)
    plan = recompute.plan(graph, method)
    assert plan.schedule is not None and plan.schedule.recomputations() == plan.info["recomputations"] > 0
    planned = copy.deepcopy(model)
    # traced with the loss: the executor returns it, so the step's "forward" is the identity
    assert_same(ref, train_step(planned, recompute.execute(graph, plan, planned), inputs, 0, loss_fn=lambda loss: loss))
    measured = measure(planned, inputs, runner=recompute.execute(graph, plan, planned), backend="fake").peak_bytes
    assert plan.peak == measured < recompute.plan(graph, "vanilla").peak
    assert plan.overhead > 0 and plan.memory_model == "simulator"


def test_without_a_budget_the_smallest_simulated_peak_over_slot_counts() -> None:
    _, _, _, graph = _traced("cross_modal", TINY)
    lengths = join_of(graph).lengths
    peaks = [recompute.plan(graph, "join_dp", slots=c).peak for c in range(c_min(lengths), c_opt(lengths) + 1)]
    best = recompute.plan(graph, "join_dp")
    assert best.peak == min(peaks)
    assert best.info["slots_searched"] == (c_min(lengths), c_opt(lengths))


def test_a_budget_bounds_the_simulated_peak_with_the_fewest_recomputations() -> None:
    _, _, _, graph = _traced("cross_modal", TINY)
    lengths = join_of(graph).lengths
    plans = [recompute.plan(graph, "join_dp", slots=c) for c in range(c_min(lengths), c_opt(lengths) + 1)]
    smallest = min(p.peak for p in plans)
    budget = (smallest + recompute.plan(graph, "vanilla").peak) // 2
    got = recompute.plan(graph, "join_dp", budget=budget)
    assert got.peak <= budget and got.budget == budget
    assert got.info["recomputations"] == min(p.info["recomputations"] for p in plans if p.peak <= budget)
    with pytest.raises(recompute.InfeasibleBudget) as info:
        recompute.plan(graph, "join_dp", budget=smallest - 1)
    assert info.value.min_budget == smallest


def test_chen_recursive_checks_its_budget() -> None:
    _, _, _, graph = _traced("chain", {})
    plan = recompute.plan(graph, "chen_recursive", k=2)
    assert plan.info["k"] == 2
    assert recompute.plan(graph, "chen_recursive", k=2, budget=plan.peak).peak == plan.peak
    with pytest.raises(recompute.InfeasibleBudget):
        recompute.plan(graph, "chen_recursive", k=2, budget=plan.peak - 1)


def test_revolve_trains_a_model_traced_without_its_loss() -> None:
    model, (x,) = nets.build("chain", seed=0)
    plan = check_plan(model, (x,), lambda g: recompute.plan(g, "revolve", slots=3))
    assert plan.slots == 3 and plan.schedule.recomputations() > 0


def test_options_are_declared_and_graphs_without_a_program_refused() -> None:
    assert [spec(m).options for m in ("revolve", "join_dp", "chen_recursive")] == [("slots",), ("slots",), ("k",)]
    edges = Graph.from_edges([(0, 1), (1, 2)], [1, 1, 1], [1, 1, 1])
    with pytest.raises(TypeError, match="no option"):
        recompute.plan(edges, "revolve", k=2)
    with pytest.raises(ValueError, match="traced graph"):
        recompute.plan(edges, "revolve")


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"logits": self.a(h), "aux": self.b(h)}


def test_a_graph_of_another_shape_is_refused_saying_which_planners_take_it():
    with pytest.raises(ValueError, match=r"chain ends at one output; this graph has 2\. What to do: approxdp"):
        recompute.optimize(_TwoHeads(), method="revolve")(torch.randn(3, 8))
    model, inputs = nets.build("resblock", batch_size=2, input_size=8)
    with pytest.raises(ValueError, match=r"at least two inputs; this graph has 1\. What to do: revolve or chen_recursive"):
        recompute.optimize(model, method="join_dp")(*inputs)
