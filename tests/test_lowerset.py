"""Eq. (1) and eq. (2) by hand on small graphs, and the lower-set vocabulary on random DAGs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from .strategies import chain, dags, fig2_skip, siamese

from recompute.core import lowerset
from recompute.core.graph import Graph
from recompute.pricing.memory_model import MemoryModel

PAPER = MemoryModel.paper

# --- eq. (1) and eq. (2) by hand ------------------------------------------------------------------


def test_chain_by_hand() -> None:
    # 0 → 1 → 2 → 3, M = T = (1, 2, 3, 4); L1 = {0, 1}, L2 = V.
    g = chain(4, mem=[1, 2, 3, 4], time=[1, 2, 3, 4])
    seq = [frozenset({0, 1}), g.nodes]
    assert lowerset.boundary(g, seq[0]) == {1}  # 1 is read by 2
    assert lowerset.blocks(seq) == [{0, 1}, {2, 3}]
    # eq. (1): T(V1 \ ∂(L1)) = T({0}) = 1; the last block V2 = {2, 3} adds T = 3 + 4 = 7 verbatim.
    assert lowerset.overhead(g, seq) == 1
    assert lowerset.overhead(g, seq, include_last=True) == 1 + 7
    # eq. (2): M(1) = M(U0) + 2 M({0,1}) + M(δ⁺(L1) \ L1 = {2}) + M(δ⁻({2}) \ L1 = ∅) = 0 + 6 + 3 + 0 = 9
    #          M(2) = M(U1 = {1}) + 2 M({2,3}) + 0 + 0 = 2 + 14 = 16
    assert PAPER.block_memory(g, seq) == [9, 16]
    assert PAPER.peak(g, seq) == 16
    assert lowerset.cached_set(g, seq) == {1}


def test_fig2_skip_by_hand() -> None:
    # Fig. 2: 0 → 1 → 2 → 3 and the skip 0 → 3; M = (1, 2, 3, 4), T = (5, 6, 7, 8); L1 = {0, 1, 2}, L2 = V.
    g = fig2_skip(4, mem=[1, 2, 3, 4], time=[5, 6, 7, 8])
    seq = [frozenset({0, 1, 2}), g.nodes]
    assert lowerset.boundary(g, seq[0]) == {0, 2}  # both read by 3
    # eq. (1): T(V1 \ ∂(L1)) = T({1}) = 6; verbatim adds T(V2) = T({3}) = 8.
    assert lowerset.overhead(g, seq) == 6
    assert lowerset.overhead(g, seq, include_last=True) == 6 + 8
    # eq. (2): M(1) = 0 + 2·(1+2+3) + M({3}) + M(δ⁻({3}) \ L1 = ∅) = 12 + 4 = 16
    #          M(2) = M(U1 = {0, 2}) + 2 M({3}) = 4 + 8 = 12
    assert PAPER.block_memory(g, seq) == [16, 12]
    # Vanilla (k = 1): 2 M(V) = 20; ∂(L) = {0, 1} for L = {0, 1}: the skip keeps 0 in every boundary.
    assert PAPER.peak(g, [g.nodes]) == 20
    assert lowerset.boundary(g, {0, 1}) == {0, 1}


def test_siamese_by_hand() -> None:
    # 0 → 1 → 4 ← 3 ← 2; M = (1, 2, 3, 4, 5), T = (3, 1, 4, 1, 5); L1 = {0, 1}, L2 = V.
    g = siamese(2, mem=[1, 2, 3, 4, 5], time=[3, 1, 4, 1, 5])
    seq = [frozenset({0, 1}), g.nodes]
    # eq. (1): T(V1 \ ∂(L1) = {0}) = 3; verbatim adds T({2, 3, 4}) = 4 + 1 + 5 = 10.
    assert lowerset.overhead(g, seq) == 3
    assert lowerset.overhead(g, seq, include_last=True) == 13
    # eq. (2): M(1) = 0 + 2·(1+2) + M(δ⁺(L1) \ L1 = {4}) + M(δ⁻({4}) \ L1 = {3}) = 6 + 5 + 4 = 15
    #          M(2) = M(U1 = {1}) + 2·(3+4+5) = 2 + 24 = 26
    assert PAPER.block_memory(g, seq) == [15, 26]
    assert PAPER.peak(g, seq) == 26


def test_check_sequence_rejects() -> None:
    g = chain(3)
    lowerset.check_sequence(g, [{0}, {0, 1}, {0, 1, 2}])
    with pytest.raises(ValueError, match="not a lower set"):
        lowerset.check_sequence(g, [{1}, {0, 1, 2}])
    with pytest.raises(ValueError, match="strictly"):
        lowerset.check_sequence(g, [{0}, {0}, {0, 1, 2}])
    with pytest.raises(ValueError, match="strictly"):
        lowerset.check_sequence(g, [{0, 1}, {0}, {0, 1, 2}])
    with pytest.raises(ValueError, match="must be V"):
        lowerset.check_sequence(g, [{0}, {0, 1}])
    with pytest.raises(ValueError):
        lowerset.check_sequence(g, [])


# --- properties on random DAGs --------------------------------------------------------------------


@st.composite
def graph_and_lower_sets(draw: st.DrawFn) -> tuple[Graph, frozenset[int], frozenset[int]]:
    """A DAG and two lower sets, each a union of some L_v."""
    g = draw(dags())
    pruned = lowerset.pruned_lower_sets(g)
    picks = st.lists(st.integers(0, g.n - 1), max_size=g.n)
    a = frozenset().union(*(pruned[v] for v in draw(picks)))
    b = frozenset().union(*(pruned[v] for v in draw(picks)))
    return g, a, b


@settings(max_examples=150, deadline=None)
@given(dags())
def test_pruned_lower_sets(g: Graph) -> None:
    for v, lower in enumerate(lowerset.pruned_lower_sets(g)):
        assert v in lower and lowerset.is_lower_set(g, lower)
        assert lowerset.delta_minus(g, lower) <= lower
        assert all(u in lower for u in g.preds[v])
    assert lowerset.boundary(g, g.nodes) == frozenset()


@settings(max_examples=150, deadline=None)
@given(dags(), st.data())
def test_set_operators_are_their_definitions_on_any_set(g: Graph, data: st.DataObject) -> None:
    # they run over the edge arrays; here each is its definition over ``preds``, on sets that need
    # not be lower sets (the oracles below build on them)
    s = frozenset(data.draw(st.sets(st.sampled_from(sorted(g.nodes)))))
    assert lowerset.delta_plus(g, s) == {w for w in g.nodes for u in g.preds[w] if u in s}
    assert lowerset.delta_minus(g, s) == {u for v in s for u in g.preds[v]}
    assert lowerset.is_lower_set(g, s) == all(u in s for v in s for u in g.preds[v])
    assert lowerset.boundary(g, s) == {u for w in g.nodes - s for u in g.preds[w] if u in s}


@settings(max_examples=150, deadline=None)
@given(graph_and_lower_sets())
def test_lower_set_algebra(case: tuple[Graph, frozenset[int], frozenset[int]]) -> None:
    g, a, b = case
    for lower in (a, b, a | b, a & b):
        assert lowerset.is_lower_set(g, lower)
        assert lowerset.delta_minus(g, lower) <= lower
        bd = lowerset.boundary(g, lower)
        assert bd <= lower
        # ∂(L) are exactly the nodes of L read from V \ L.
        assert bd == lowerset.delta_minus(g, g.nodes - lower) & lower
    # Adding to a lower set a node whose predecessor is missing breaks it.
    for v in g.nodes - a:
        if any(u not in a for u in g.preds[v]):
            assert not lowerset.is_lower_set(g, a | {v})


@settings(max_examples=150, deadline=None)
@given(graph_and_lower_sets())
def test_sequence_costs(case: tuple[Graph, frozenset[int], frozenset[int]]) -> None:
    g, a, b = case
    seq = [s for s in sorted({a & b, a | b, g.nodes} - {frozenset()}, key=len)]
    lowerset.check_sequence(g, seq)
    # eq. (1) verbatim equals its left-hand side T(V \ U_k); our default drops the last block.
    kept = lowerset.cached_set(g, seq)
    assert lowerset.overhead(g, seq, include_last=True) == sum(int(g.time[v]) for v in g.nodes - kept)
    last = lowerset.blocks(seq)[-1]
    assert lowerset.overhead(g, seq) == lowerset.overhead(g, seq, include_last=True) - sum(int(g.time[v]) for v in last)
    assert PAPER.peak(g, seq) == max(PAPER.block_memory(g, seq)) <= PAPER.peak(g, [g.nodes]) + g.total_mem()
    assert PAPER.peak(g, [g.nodes]) == 2 * g.total_mem()
    assert PAPER.block_memory(g, seq) == _eq2(g, seq)
    assert MemoryModel.liveness.block_memory(g, seq) == _liveness(g, seq)
    if len(seq) > 1:  # repeating or reversing sets is rejected
        with pytest.raises(ValueError):
            lowerset.check_sequence(g, [seq[0], *seq])
        with pytest.raises(ValueError):
            lowerset.check_sequence(g, seq[::-1])


def _eq2(g: Graph, seq: list[frozenset[int]]) -> list[int]:
    """Eq. (2) verbatim: M(i) = M(U_{i-1}) + 2 M(V_i) + M(δ⁺(L_i) \\ L_i) + M(δ⁻(δ⁺(L_i)) \\ L_i)."""
    m = lambda s: sum(int(g.mem[v]) for v in s)  # noqa: E731
    out, cached = [], frozenset()
    for lower, block in zip(seq, lowerset.blocks(seq)):
        above = lowerset.delta_plus(g, lower) - lower
        out.append(m(cached) + 2 * m(block) + m(above) + m(lowerset.delta_minus(g, above) - lower))
        cached |= lowerset.boundary(g, lower)
    return out


def _liveness(g: Graph, seq: list[frozenset[int]]) -> list[int]:
    """M'(i) = M(U_i) + S(V_i \\ U_i) + M(δ⁺(L_i) \\ L_i) + S(δ⁻(δ⁺(L_i)) \\ L_i) + 2 max_v M_v."""
    m = lambda s: sum(int(g.mem[v]) for v in s)  # noqa: E731
    saved = lambda s: sum(int(g.saved[v]) for v in s)  # noqa: E731
    out, cached = [], frozenset()
    for lower, block in zip(seq, lowerset.blocks(seq)):
        above = lowerset.delta_plus(g, lower) - lower
        cached |= lowerset.boundary(g, lower)
        out.append(m(cached) + saved(block - cached) + m(above) + saved(lowerset.delta_minus(g, above) - lower)
                   + 2 * int(g.mem.max()))
    return out
