"""The library's front door: wrong arguments to ``trace``, ``optimize``, ``plan`` and ``Graph.from_edges`` fail
at once with an error that names the argument, what it got and what to do; ``exhaustive`` refuses a graph
too large for it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

import recompute
from recompute import Graph
from experiments import nets
from recompute.planners.registry import simulated_peak
from recompute.planners.exhaustive import MAX_NODES, GraphTooLarge
from recompute.rewrites.pipeline import with_in_place


class Scaled(nn.Module):
    """A model whose forward takes a non-tensor argument."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return self.conv(x) * scale


X = torch.randn(2, 3, 8, 8)


@pytest.fixture(scope="module")
def chain() -> tuple[nn.Module, tuple[torch.Tensor, ...], Graph]:
    model, inputs = nets.build("chain", seed=0)
    return model, inputs, recompute.trace(model, inputs)


def test_a_non_tensor_argument_is_named_where_a_trace_cannot_take_it():
    with pytest.raises(TypeError, match=r"example input 1 is a float 2.0, not a tensor.*wrap.*recompute.optimize does"):
        recompute.trace(Scaled(), (X, 2.0))


@pytest.mark.parametrize("inputs, named", [
    ((), "a non-empty tuple/list of tensors, got a tuple ()"),
    ("x", "got a str 'x'"),
    (None, "got a NoneType None"),
    ([X, [X]], "example input 1 is a list"),
])
def test_inputs_that_are_not_tensors_are_named(inputs, named):
    with pytest.raises(TypeError, match=named.replace("(", r"\(").replace(")", r"\)")):
        recompute.trace(nets.build("chain")[0], inputs)


@pytest.mark.parametrize("call", [
    lambda: recompute.trace(torch.relu, (X,)),
    lambda: recompute.trace(lambda x: x * 2, (X,)),
    lambda: recompute.optimize(torch.relu),
], ids=["trace-builtin", "trace-lambda", "optimize"])
def test_a_plain_function_instead_of_a_module_is_named(call):
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got a function .*wrap the function in a module"):
        call()


@pytest.mark.parametrize("budget, error, named", [
    ("1GB", TypeError, r"budget must be a number of bytes \(an int\) or None, got a str '1GB'; convert it first"),
    (True, TypeError, "got a bool True"),
    ([10], TypeError, "got a list"),
    (-5, ValueError, "budget must be a positive number of bytes or None, got -5"),
    (0, ValueError, "got 0"),
    (math.nan, ValueError, "got nan"),
    (math.inf, ValueError, "got inf"),
])
def test_a_bad_budget_is_named(chain, budget, error, named):
    model, inputs, graph = chain
    with pytest.raises(error, match=named):
        recompute.plan(graph, "approxdp", budget=budget)
    with pytest.raises(error, match=named):
        recompute.optimize(model, budget=budget)


def test_numeric_budgets_are_accepted(chain):
    _, _, graph = chain
    smallest = recompute.plan(graph, "approxdp").budget
    for budget in (smallest, float(smallest), torch.tensor(smallest).numpy()[()]):
        assert recompute.plan(graph, "approxdp", budget=budget).peak <= smallest


@pytest.mark.parametrize("kwargs, error, named", [
    (dict(method="approx"), ValueError, "unknown method 'approx'; choose one of .*approxdp"),
    (dict(method="approxdp", strategy="fast"), ValueError, "unknown strategy 'fast'; choose one of tc, mc"),
    (dict(method="exactdp", memroy_model="paper"), TypeError,
     "planner 'exactdp' has no option 'memroy_model'; its options: budget, strategy, max_lower_sets, time_levels, memory_model"),
    (dict(method="chen", memory_model="paper"), TypeError, "planner 'chen' has no option 'memory_model'; its options: budget, cuts$"),
    (dict(method="chen", strategy="mc"), TypeError, r"planner 'chen' has no option 'strategy' \(got strategy='mc'\); its options: budget, cuts$"),
    (dict(method="exactdp", memory_model="lively"), ValueError, "memory_model='lively'; choose one of simulator, paper, liveness"),
    (dict(method="exactdp", time_levels="many"), TypeError, "time_levels='many' is a str 'many'; expected type int"),
    (dict(method="exactdp", max_lower_sets=1.5), TypeError, "max_lower_sets=1.5 .* expected type int"),
    (dict(method="approxdp", time_levels=0), ValueError, "time_levels=0; must be a positive integer"),
    (dict(method="chen_greedy", grid=-1), ValueError, "grid=-1; must be a positive integer"),
    (dict(method="exhaustive", max_nodes=0), ValueError, "max_nodes=0; must be a positive integer"),
])
def test_a_bad_planner_argument_is_named(chain, kwargs, error, named):
    _, _, graph = chain
    with pytest.raises(error, match=named):
        recompute.plan(graph, **kwargs)


def test_optimize_checks_planner_arguments_before_the_first_step(chain):
    model, _, _ = chain
    with pytest.raises(TypeError, match="no option 'time_level'"):
        recompute.optimize(model, method="exactdp", time_level=10)  # no example inputs: planning would be lazy


def test_plan_needs_a_graph(chain):
    model, _, _ = chain
    with pytest.raises(TypeError, match=r"got a module of type Chain; trace the model first"):
        recompute.plan(model, "approxdp")


def test_a_plan_of_another_graph_is_refused_before_it_runs(chain):
    """Its lower sets name nodes of the other graph (a ``KeyError`` deep inside, or the wrong model's
    step run without a word), or its schedule ops of the other graph's step."""
    model, inputs, graph = chain
    other = recompute.trace(*nets.build("skip", seed=0))
    mine = recompute.plan(graph, "approxdp")
    named = "this plan was made for another graph .*; plan this graph: recompute.plan"
    for run in (lambda: recompute.execute(other, mine), lambda: mine.runs(other),
                lambda: simulated_peak(other, mine), lambda: with_in_place(mine, other)):
        with pytest.raises(ValueError, match=named):
            run()
    with pytest.raises(ValueError, match=rf"its lower sets cover {graph.n} nodes, this graph has {other.n}"):
        recompute.execute(other, mine)
    # a schedule over the other step's ops, under lower sets of this graph's size
    borrowed = replace(recompute.plan(other, "approxdp"), schedule=with_in_place(mine, graph).schedule)
    with pytest.raises(ValueError, match=r"its schedule names '\w+'.*, which this graph's step does not have"):
        recompute.execute(other, borrowed)
    assert recompute.execute(graph, mine)(*inputs) is not None  # its own graph's plan runs


def test_an_unknown_cost_model_is_named_before_tracing(chain):
    model, inputs, _ = chain
    with pytest.raises(ValueError, match="unknown cost_model 'flop'; choose one of paper, flops, measured"):
        recompute.trace(model, inputs, cost_model="flop")


@pytest.mark.parametrize("args, kwargs, error, named", [
    (([(0, 1, 2)], [1, 1, 1], [1, 1, 1]), {}, TypeError, r"edges\[0\] = \(0, 1, 2\): each edge must be a pair"),
    ((["01"], [1, 1], [1, 1]), {}, TypeError, r"edges\[0\] = '01'"),
    (([(0, 1.0)], [1, 1], [1, 1]), {}, TypeError, r"edges\[0\] = \(0, 1.0\)"),
    ((5, [1, 1], [1, 1]), {}, TypeError, "edges must be a sequence, got int 5"),
    (([(0, 2)], [1, 1], [1, 1]), {}, ValueError, r"edge \(0, 2\) names a node outside 0..1"),
    (([], "12", [1, 1]), {}, TypeError, "mem must be a sequence, got str '12'"),
    (([], [1.5, 2], [1, 1]), {}, TypeError, r"mem\[0\] = 1.5: mem must hold integers"),
    (([], [1, -2], [1, 1]), {}, ValueError, r"mem\[1\] = -2: mem must be non-negative"),
    (([], [1, 2], [1]), {}, ValueError, "time needs one entry per node: mem has 2, time has 1"),
    (([], [1, 2], [1, None]), {}, TypeError, r"time\[1\] = None"),
    (([], [1, 2], [1, 1]), dict(names=["a"]), ValueError, r"names needs one label per node \(2\)"),
    (([], [1, 2], [1, 1]), dict(outputs=[5]), ValueError, r"outputs \[5\] name nodes outside 0..1"),
    (([], [1, 2], [1, 1]), dict(outputs=["x"]), TypeError, r"outputs\[0\] = 'x'"),
])
def test_from_edges_names_the_bad_argument(args, kwargs, error, named):
    with pytest.raises(error, match=named):
        Graph.from_edges(*args, **kwargs)


def test_from_edges_takes_numpy_arguments():
    import numpy as np

    g = Graph.from_edges(np.array([[0, 1], [1, 2]]), np.array([1, 2, 3]), np.array([1, 1, 1]))
    assert g.edges == [(0, 1), (1, 2)] and g.outputs == (2,)


def _chain(n: int) -> Graph:
    return Graph.from_edges([(i, i + 1) for i in range(n - 1)], [1] * n, [1] * n)


def test_exhaustive_refuses_a_graph_above_max_nodes():
    with pytest.raises(GraphTooLarge, match=rf"#V={MAX_NODES + 1} nodes, above max_nodes={MAX_NODES}.*use exactdp or approxdp"):
        recompute.plan(_chain(MAX_NODES + 1), "exhaustive")
    # the limit is an option: a chain has few lower sets, so a longer one is still quick
    assert recompute.plan(_chain(MAX_NODES + 1), "exhaustive", max_nodes=MAX_NODES + 1).k >= 1
    assert recompute.plan(_chain(MAX_NODES), "exhaustive").k >= 1
