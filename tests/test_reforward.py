"""Re-forwarding (Feng & Huang 2018): Algorithm 1 against brute force, Algorithm 6 against the linear
split, the paper's example shapes (Figs. 3–4), and exact execution of both planners' plans."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import recompute
from recompute.core import lowerset
from experiments import nets
from recompute.core.graph import Graph
from recompute.planners.reforward import (
    CloseSet, OptimizationGraph, branches, linear_solver, maximal_split, reorganise, splitting_vertices,
)

from .exactness import check_plan, check_plans
from .models import RandomDAGNet
from .strategies import chain, dags

FAST = settings(max_examples=60, deadline=None)
METHODS = ("reforward_linear", "reforward")


def eq1_linear(vertex: list[int], segment: list[int], stored: tuple[int, ...]) -> int:
    """Eq. (1) on x_0 … x_r storing ``stored`` (ends included): Σ l + the largest re-forward."""
    worst = max(sum(vertex[p + 1:q]) + sum(segment[p:q]) for p, q in zip(stored[:-1], stored[1:]))
    return sum(vertex[u] for u in stored) + worst


def brute_force_linear(vertex: list[int], segment: list[int]) -> int:
    r = len(vertex) - 1
    return min(
        eq1_linear(vertex, segment, (0, *inner, r))
        for k in range(r)
        for inner in itertools.combinations(range(1, r), k)
    )


def check_solution(g: Graph, p: recompute.Plan) -> None:
    """The plan is a lower-set sequence that caches only stored vertexes, and its eq. (1) bookkeeping adds up."""
    lowerset.check_sequence(g, p.lower_sets)
    stored = set(p.info["stored"])
    assert p.info["feng_stored"] == int(g.mem[sorted(stored)].sum())
    assert p.info["feng_memory"] == p.info["feng_stored"] + p.info["feng_max_reforward"]
    assert p.cached <= stored
    # a segment never touches another one's vertexes, so each connected part of V \ V_R lies in one segment
    rest = g.nodes - stored
    seen: set[int] = set()
    for v in rest:
        if v in seen:
            continue
        part, todo = set(), [v]
        while todo:
            u = todo.pop()
            if u in part:
                continue
            part.add(u)
            todo += [w for w in (*g.preds[u], *g.succs[u]) if w in rest]
        seen |= part
        assert int(g.mem[sorted(part)].sum()) <= p.info["feng_max_reforward"]


# --- Algorithm 1 ----------------------------------------------------------------------------------


@FAST
@given(st.data())
def test_linear_solver_matches_brute_force(data: st.DataObject) -> None:
    r = data.draw(st.integers(1, 9))
    vertex = data.draw(st.lists(st.integers(0, 100), min_size=r + 1, max_size=r + 1))
    segment = data.draw(st.lists(st.sampled_from([0, 0, 1, 7, 30, 120]), min_size=r, max_size=r))
    sol = linear_solver(vertex, segment)
    assert sol.memory == brute_force_linear(vertex, segment)
    assert sol.memory == eq1_linear(vertex, segment, tuple(sol.stored))


@FAST
@given(st.lists(st.integers(0, 100), min_size=1, max_size=10))
def test_reforward_on_chains_matches_brute_force(mem: list[int]) -> None:
    g = chain(len(mem), mem=mem)
    best = brute_force_linear([0, *mem, 0], [0] * (len(mem) + 1))  # s and t cost nothing
    for method in METHODS:
        p = recompute.plan(g, method)
        assert p.info["feng_memory"] == best, method
        check_solution(g, p)


def test_skip_rule_solves_fewer_max_terms() -> None:
    rng = np.random.default_rng(0)
    g = chain(60, mem=rng.integers(1, 1000, 60).tolist())
    p = recompute.plan(g, "reforward")
    assert p.info["max_terms_tried"] < p.info["max_terms"] / 5


# --- Algorithm 6 on arbitrary graphs ----------------------------------------------------------------


@FAST
@given(dags())
def test_reforward_never_worse_than_the_linear_split(g: Graph) -> None:
    linear, arbitrary = (recompute.plan(g, m) for m in METHODS)
    assert arbitrary.info["feng_memory"] <= linear.info["feng_memory"] <= g.total_mem()
    check_solution(g, linear)
    check_solution(g, arbitrary)


# --- the paper's shapes (Figs. 3 and 4) ----------------------------------------------------------


def optimization_graph(edges: list[tuple[int, int]], n: int) -> OptimizationGraph:
    return OptimizationGraph.of(Graph.from_edges(edges, [1] * n, [1] * n))


def test_splitting_vertices_cut_into_linear_segments() -> None:
    # Theorem 3 (Fig. 4 (a)): 0 → {1, 2} → 3 → {4 → 5, 5}: the splitting vertexes of s_st are 0, 3 and 5
    og = optimization_graph([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (4, 5), (3, 5)], 6)
    top = CloseSet(og.source, og.target, np.arange(6))
    assert splitting_vertices(og, top).tolist() == [0, 3, 5]
    h = reorganise(og, top)
    assert h.kind == "linear" and h.vertices.tolist() == [0, 3, 5]
    assert [m.kind for m in h.members] == ["trivial", "split", "split", "trivial"]  # s_03 and s_35 are branched


def test_branched_close_set() -> None:
    # Fig. 3 (c): s_02 with the edge (0, 2) is branched: the edge and the path through 1
    og = optimization_graph([(0, 1), (1, 2), (0, 2)], 3)
    parts = branches(og, CloseSet(0, 2, np.array([1]), edge=True))
    assert [(p.interior.tolist(), p.edge) for p in parts] == [([], True), ([1], False)]


def test_maximal_split_of_fig4b() -> None:
    # Fig. 4 (b): s_14 with edges 12, 13, 23, 24, 34 has 0 splitting vertex; its maximal split is its 5 edges
    og = optimization_graph([(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)], 4)
    cs = CloseSet(0, 3, np.array([1, 2]))
    assert splitting_vertices(og, cs).size == 0 and len(branches(og, cs)) == 1
    split = maximal_split(og, cs)
    assert sorted((m.i, m.j) for m in split) == [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)]
    assert all(m.interior.size == 0 for m in split)


@pytest.mark.parametrize("edges", [
    # a chain 1 → 2 → 10 → 12 → t beside other paths from 1 to t: Algorithm 4 finds s_1,12 and s_2,t
    [(0, 1), (0, 5), (1, 2), (1, 3), (1, 4), (1, 6), (2, 10), (3, 9), (3, 13), (3, 14), (4, 17), (5, 7),
     (5, 16), (6, 8), (6, 11), (6, 17), (7, 13), (7, 15), (10, 12), (11, 17), (13, 15)],
    # the same meeting in a bare edge: s_0,12 ∋ 3 and s_3,14 ∋ 12 cross at the edge (3, 12)
    [(0, 1), (0, 2), (0, 3), (0, 5), (0, 9), (0, 10), (0, 11), (0, 13), (0, 15), (1, 3), (2, 4), (2, 6),
     (2, 7), (2, 14), (3, 12), (4, 10), (5, 6), (5, 14), (5, 16), (6, 8), (12, 14), (13, 16)],
])
def test_maximal_split_merges_crossing_members(edges: list[tuple[int, int]]) -> None:
    # Algorithm 4 forms only the close set of everything between two vertexes; crossing pieces are merged
    n = 1 + max(v for e in edges for v in e)
    og = optimization_graph(edges, n)
    cs = max(branches(og, CloseSet(0, og.target, np.arange(1, n))), key=lambda b: b.interior.size)
    assert splitting_vertices(og, cs).size == 0
    split = maximal_split(og, cs)
    for m in split:
        others = [x for x in split if x is not m]
        assert not set(m.interior.tolist()) & {v for x in others for v in (x.i, x.j, *x.interior.tolist())}
    g = Graph.from_edges(edges, list(range(1, n + 1)), [1] * n)
    check_solution(g, recompute.plan(g, "reforward"))


def test_dense_block_stores_every_concatenation() -> None:
    # A dense block as today's torchvision builds it: layer k concatenates the input x and every earlier
    # output f_j afresh (cat_k), then a chain cat_k → a_k → f_k. No vertex splits the block, whose maximal
    # split is the chains and the edges into the concatenations: the cat_k and f_k in between are stored
    # (cat_0 reads x alone and f_last feeds the end alone: their chains are members that include them).
    x, layers, edges, ids = 0, 4, [], iter(range(1, 100))
    outs: list[int] = []
    for _ in range(layers):
        cat, a, f = next(ids), next(ids), next(ids)
        edges += [(x, cat), *((o, cat) for o in outs), (cat, a), (a, f)]
        outs.append(f)
    end = next(ids)
    edges += [(x, end), *((o, end) for o in outs)]
    n = end + 1
    mem = [1] * n
    for k in range(layers):
        mem[2 + 3 * k] = 50  # a_k: the chain's big inner vertex
    g = Graph.from_edges(edges, mem, [1] * n)
    p = recompute.plan(g, "reforward")
    cats, chains = [1 + 3 * k for k in range(layers)], [2 + 3 * k for k in range(layers)]
    stored = set(p.info["stored"])
    assert set(cats[1:]) | set(outs[:-1]) <= stored and not set(chains) & stored
    linear = recompute.plan(g, "reforward_linear")  # only x and the last concatenation split the graph
    assert p.info["feng_memory"] < linear.info["feng_memory"]


# --- execution ------------------------------------------------------------------------------------


def by(method: str):
    return lambda graph: recompute.plan(graph, method)


@pytest.mark.parametrize("net", ["resblock", "dropout", "siamese", "skip"])
def test_plans_execute_exactly(net: str) -> None:
    model, inputs = nets.build(net)
    plans = check_plans(model, inputs, [by(m) for m in METHODS])
    if net == "resblock":
        assert plans[1].recomputed(), "the test must recompute something"


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000))
def test_random_dag_models_execute_exactly(seed: int) -> None:
    check_plan(RandomDAGNet(seed), (torch.randn(2, 4, 6, 6),), by("reforward"), seed=seed)


def test_tensor_graph_merges_in_place_ops_and_lifts_plans() -> None:
    from experiments.feng_table1 import lift, tensor_graph

    model, inputs = nets.build("resblock")  # in-place ReLUs, one after every BatchNorm and every residual add
    graph = recompute.trace(model, inputs)
    tg, members = tensor_graph(graph)
    relus = [v for v in range(graph.n) if "relu" in graph.ops[v]]
    assert tg.n == graph.n - len(relus) and sorted(v for m in members for v in m) == list(range(graph.n))
    check_plan(model, inputs, lambda g: lift(g, recompute.plan(tensor_graph(g)[0], "reforward"), tensor_graph(g)[1]))
