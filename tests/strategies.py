"""Hypothesis strategies and hand-made graphs for the planner and lower-set tests."""

from __future__ import annotations

from typing import Sequence

from hypothesis import strategies as st

from recompute.core.graph import Graph


@st.composite
def dags(draw: st.DrawFn, min_nodes: int = 2, max_nodes: int = 12) -> Graph:
    """A random DAG shaped like a network: nodes numbered in a random order, each node after the
    first in a random topological order reads one earlier node (so every node hangs off the first
    one), plus random extra edges forward in that order; M_v ∈ 1..100, T_v ∈ 1..10."""
    n = draw(st.integers(min_nodes, max_nodes))
    order = draw(st.permutations(range(n)))  # order[i] is the i-th node in topological order
    edges = set()
    for i in range(1, n):
        edges.add((order[draw(st.integers(0, i - 1))], order[i]))
        for j in range(i - 1):
            if draw(st.integers(0, 3)) == 3:  # ~1 in 4 of the other forward pairs
                edges.add((order[j], order[i]))
    mem = draw(st.lists(st.integers(1, 100), min_size=n, max_size=n))
    time = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
    return Graph.from_edges(sorted(edges), mem, time)


def chain(n: int, mem: Sequence[int] | None = None, time: Sequence[int] | None = None) -> Graph:
    """v_0 → v_1 → … → v_{n-1}, unit costs unless given."""
    return Graph.from_edges([(i, i + 1) for i in range(n - 1)], mem or [1] * n, time or [1] * n)


def fig2_skip(n: int = 6, mem: Sequence[int] | None = None, time: Sequence[int] | None = None) -> Graph:
    """Kusumoto et al. Fig. 2: a chain with a skip connection from its first node to its last, so no
    node lies on every path and Chen's segmentation cannot split it."""
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, n - 1)]
    return Graph.from_edges(edges, mem or [1] * n, time or [1] * n)


def siamese(branch: int = 3, mem: Sequence[int] | None = None, time: Sequence[int] | None = None) -> Graph:
    """Two independent chains of ``branch`` nodes joined by one last node (0..b-1, b..2b-1, then 2b)."""
    n = 2 * branch + 1
    edges = [(i, i + 1) for i in range(branch - 1)]
    edges += [(branch + i, branch + i + 1) for i in range(branch - 1)]
    edges += [(branch - 1, n - 1), (2 * branch - 1, n - 1)]
    return Graph.from_edges(edges, mem or [1] * n, time or [1] * n)


def ladder(steps: int) -> Graph:
    """A two-layer RNN unrolled over ``steps``: a_t → a_{t+1}, a_t → b_t, b_t → b_{t+1} (a_t = 2t, b_t = 2t+1),
    unit costs. Every cut across time holds both layers' state, so no node but the last lies on every path."""
    edges = [(2 * t, 2 * t + 1) for t in range(steps)]
    edges += [(2 * t + d, 2 * t + 2 + d) for t in range(steps - 1) for d in (0, 1)]
    return Graph.from_edges(edges, [1] * 2 * steps, [1] * 2 * steps)
