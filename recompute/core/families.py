"""Families of lower sets as packed bitsets, the form the DPs and the block pricing work on.

Row r of a (K, W) ``uint64`` array is the lower set L_r: bit ``v & 63`` of word ``v >> 6`` is set iff
v ∈ L_r. :func:`all_lower_sets` is the exact DP's family (Kusumoto et al. 2019, §4.2) and
:func:`pruned_family` the approximate DP's {L_v | v ∈ V} ∪ {∅, V} (§4.3).
"""

from __future__ import annotations

import numba
import numpy as np

from recompute.core.graph import Graph

__all__ = ["TooManyLowerSets", "all_lower_sets", "pruned_family", "pack_rows", "unpack_rows", "has"]


class TooManyLowerSets(ValueError):
    """The exact DP's family of lower sets grew past ``max_lower_sets``."""

    def __init__(self, count: int, limit: int, size: int):
        self.count, self.limit = count, limit
        super().__init__(
            f"exactdp: the graph has more than max_lower_sets={limit} lower sets ({count} found among those "
            f"of at most {size} nodes); raise max_lower_sets or use approxdp"
        )


def _words(n: int) -> int:
    return max(1, (n + 63) // 64)


def pack_rows(member: np.ndarray) -> np.ndarray:
    """(K, n) booleans → (K, W) uint64 bitsets."""
    k, n = member.shape
    padded = np.zeros((k, _words(n) * 64), dtype=bool)
    padded[:, :n] = member
    return np.packbits(padded, axis=1, bitorder="little").view(np.uint64)


def unpack_rows(bits: np.ndarray, n: int) -> np.ndarray:
    """(K, W) uint64 bitsets → (K, n) booleans."""
    return np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :n].astype(bool)


@numba.njit(cache=True)
def has(bits: np.ndarray, r: int, v: int) -> bool:
    """v ∈ L_r, inside numba kernels."""
    return (bits[r, v >> 6] >> np.uint64(v & 63)) & np.uint64(1) != 0


def all_lower_sets(g: Graph, max_lower_sets: int = 200_000) -> np.ndarray:
    """Every lower set of G, by size (∅ first, V last).

    Level s + 1 is {L ∪ {v} | L of size s, v ∉ L, δ⁻({v}) ⊆ L}: one matrix product per level finds
    the addable nodes of all sets of the level at once.
    """
    n = g.n
    pred = np.zeros((n, n), dtype=np.float32)  # pred[u, v] = 1 iff (u, v) ∈ E
    for v, ps in enumerate(g.preds):
        pred[list(ps), v] = 1.0
    n_preds = pred.sum(axis=0)
    level = np.zeros((1, _words(n)), dtype=np.uint64)
    levels, count = [level], 1
    for size in range(n):
        member = unpack_rows(level, n)
        # v is addable to L iff v ∉ L and all its predecessors are in L (counts are exact in float32).
        addable = ~member & (member.astype(np.float32) @ pred == n_preds)
        rows, nodes = np.nonzero(addable)
        grown = level[rows].copy()
        grown[np.arange(len(rows)), nodes >> 6] |= np.left_shift(np.uint64(1), (nodes & 63).astype(np.uint64))
        level = np.unique(grown, axis=0)
        count += len(level)
        if count > max_lower_sets:
            raise TooManyLowerSets(count, max_lower_sets, size + 1)
        levels.append(level)
    return np.concatenate(levels)


def pruned_family(g: Graph) -> np.ndarray:
    """{L_v | v ∈ V} ∪ {∅, V} of §4.3."""
    member = np.vstack([np.zeros((1, g.n), bool), g.ancestors_mask(), np.ones((1, g.n), bool)])
    return pack_rows(np.unique(member, axis=0))  # L_v = V for a node every other node reaches
