"""Lower sets and the cost of a lower-set sequence (Kusumoto et al. 2019, §2–3).

Sets of nodes are plain Python sets/frozensets of node ids. A *lower set* L ≺ V has no edge from
V \\ L into L (δ⁻(L) ⊆ L); its *boundary* ∂(L) = δ⁻(V \\ L) ∩ L are the nodes of L that are read
from outside it. A strictly increasing sequence L1 ≺ … ≺ Lk = V defines blocks Vi = Li \\ Li-1 and
the *canonical strategy*: cache ∂(Li) after computing Vi, recompute Vi \\ ∂(Li) in backward.
"""

from __future__ import annotations

from typing import AbstractSet, Iterable, Sequence

import numpy as np

from recompute.core.graph import Graph

__all__ = [
    "node_mask",
    "delta_plus",
    "delta_minus",
    "is_lower_set",
    "boundary",
    "blocks",
    "check_sequence",
    "cached_set",
    "overhead",
    "pruned_lower_sets",
    "boundaries",
    "boundary_bytes",
    "split_candidates",
]

NodeSet = AbstractSet[int]


def node_mask(g: Graph, s: Iterable[int]) -> np.ndarray:
    """The set ``s`` as a boolean array over V: the set operations below run over the edge arrays."""
    inside = np.zeros(g.n, dtype=bool)
    inside[np.fromiter(s, dtype=np.int64)] = True
    return inside


def delta_plus(g: Graph, s: Iterable[int]) -> frozenset[int]:
    """δ⁺(S): nodes with an edge from some node of S."""
    src, dst = g.edge_arrays
    return frozenset(np.unique(dst[node_mask(g, s)[src]]).tolist())


def delta_minus(g: Graph, s: Iterable[int]) -> frozenset[int]:
    """δ⁻(S): nodes with an edge into some node of S."""
    src, dst = g.edge_arrays
    return frozenset(np.unique(src[node_mask(g, s)[dst]]).tolist())


def is_lower_set(g: Graph, s: NodeSet) -> bool:
    """L ≺ V iff δ⁻(L) ⊆ L: no edge enters L from outside it."""
    src, dst = g.edge_arrays
    inside = node_mask(g, s)
    return not (inside[dst] & ~inside[src]).any()


def boundary(g: Graph, lower: NodeSet) -> frozenset[int]:
    """∂(L) = δ⁻(V \\ L) ∩ L: the nodes of L that something outside L reads (the tails of the edges
    that leave L, over the edge arrays: planners call it for every lower set of a plan)."""
    src, dst = g.edge_arrays
    inside = node_mask(g, lower)
    return frozenset(np.unique(src[inside[src] & ~inside[dst]]).tolist())


def blocks(seq: Sequence[NodeSet]) -> list[frozenset[int]]:
    """V_i = L_i \\ L_{i-1} for a lower-set sequence."""
    out, prev = [], frozenset()
    for lower in seq:
        lower = frozenset(lower)
        out.append(lower - prev)
        prev = lower
    return out


def check_sequence(g: Graph, seq: Sequence[NodeSet]) -> None:
    """Raise ``ValueError`` unless ``seq`` is a strictly increasing lower-set sequence ending at V."""
    if not seq:
        raise ValueError("a lower-set sequence needs at least one set (L_k = V)")
    prev: frozenset[int] = frozenset()
    for i, lower in enumerate(seq, 1):
        lower = frozenset(lower)
        if not is_lower_set(g, lower):
            raise ValueError(f"L_{i} is not a lower set: it misses a predecessor of one of its nodes")
        if not prev < lower:
            raise ValueError(f"L_{i} does not strictly contain L_{i - 1}")
        prev = lower
    if prev != g.nodes:
        raise ValueError("the last lower set of a sequence must be V")


def cached_set(g: Graph, seq: Sequence[NodeSet]) -> frozenset[int]:
    """U_k = ∪_i ∂(L_i): everything the canonical strategy keeps from the forward pass."""
    return frozenset().union(*(boundary(g, frozenset(lower)) for lower in seq))


def overhead(g: Graph, seq: Sequence[NodeSet], *, include_last: bool = False) -> int:
    """Recomputation cost of the canonical strategy, eq. (1): Σ_i T(V_i \\ ∂(L_i)).

    Eq. (1) also charges the last block V_k (∂(V) = ∅), although its values are still alive when the
    backward pass starts and are never recomputed. By default that term is left out, so that the
    number is the work the executor really repeats (0 for vanilla); ``include_last=True`` gives eq. (1)
    verbatim.
    """
    last = len(seq) if include_last else len(seq) - 1
    src, dst = g.edge_arrays
    total, below = 0, np.zeros(g.n, dtype=bool)
    for lower in seq[:last]:
        inside = node_mask(g, lower)
        recomputed = inside & ~below
        recomputed[src[inside[src] & ~inside[dst]]] = False  # ∂(L_i) is cached, not recomputed
        total += int(g.time[recomputed].sum())
        below = inside
    return total


def pruned_lower_sets(g: Graph) -> list[frozenset[int]]:
    """The pruned family {L_v | v ∈ V} of §4.3, L_v = v and everything that reaches v."""
    a = g.ancestors_mask()
    return [frozenset(map(int, a[v].nonzero()[0])) for v in range(g.n)]


def boundaries(g: Graph, ancestors: np.ndarray | None = None) -> np.ndarray:
    """Boolean matrix B with B[u, v] true iff u ∈ ∂(L_v): every boundary of the pruned family at once.

    Row by row over the nodes u (n² booleans, no n² float product, so that an unrolled RNN's graph of
    tens of thousands of nodes fits): u ∈ ∂(L_v) iff u ∈ L_v and some successor of u is not in L_v.
    ``ancestors`` is ``g.ancestors_mask()`` where the caller has it already.
    """
    in_lower = np.ascontiguousarray((g.ancestors_mask() if ancestors is None else ancestors).T)  # row u: the v whose L_v holds u
    b = np.zeros_like(in_lower)
    for u, succs in enumerate(g.succs):
        if succs:
            b[u] = in_lower[u] & ~np.logical_and.reduce(in_lower[list(succs)], axis=0)
    return b


def boundary_bytes(g: Graph, ancestors: np.ndarray | None = None) -> np.ndarray:
    """M(∂(L_v)) for every v: the bytes a segment ending at L_v keeps (int64, indexed by v)."""
    total = np.zeros(g.n, dtype=np.int64)
    for u, in_boundary in enumerate(boundaries(g, ancestors)):  # row by row: a product would widen n² booleans to int64
        total[in_boundary] += int(g.mem[u])
    return total


def split_candidates(g: Graph) -> list[int]:
    """Nodes v with ∂(L_v) = {v} that read some other node, in topological order (by |L_v|): the
    nodes every input-to-output path passes through, where Chen et al. (2016) end a segment
    (:mod:`recompute.planners.chen`) and Revolve's chain has its steps (:mod:`recompute.planners.pebble`).

    A source is left out: the network's inputs are not in V, so a source is the first operation on
    an input, and ending a segment there keeps the rest of the graph in one segment. This is what
    makes Fig. 2 (a skip from the first node to the last) unsegmentable, as the paper says.
    """
    a = g.ancestors_mask()
    in_boundary = boundaries(g, a)
    only_self = in_boundary.sum(axis=0) == 1
    cands = [v for v in range(g.n) if only_self[v] and in_boundary[v, v] and g.preds[v]]
    sizes = a.sum(axis=1)
    return sorted(cands, key=lambda v: int(sizes[v]))
