"""Join graphs (Beaumont, Herrmann, Pallez & Shilova 2020, §3): the optimal DP, c_min, Revolve as its
one-branch case, and the Equiv-Chain heuristic of their §4c / Fig. 9.

Canonical form (§3a, Theorem 3.2): from the input x of branch m, run j forward steps, store the output,
solve the smaller join (branch m shorter by j) with one slot fewer, then back-propagate the j steps as
a chain with Opt0 (:mod:`.chain`). Hence Theorem 3.4's DP, here in the slot model of :mod:`.schedule`
(c counts the k current branch inputs; the other k − 1 branches hold their δ_0 while branch m's
segment is back-propagated):

    Opt_join(0, c) = ut                                                          c ≥ k
    Opt_join(ℓ, c) = min_{m: ℓ_m>0} min_{1≤j≤ℓ_m} j·uf + Opt_join(ℓ − j·e_m, c − 1) + Opt0(j, c − k + 1)

With k = 1 this is Revolve (Griewank & Walther 2000) for a whole chain, turn included. Our copy of
the paper lost the displayed formulas (eq. 3.1, Theorem 3.4's recurrence); both are rebuilt here from
the canonical form and the proof outlines, and ``tests/test_chain.py`` checks them against an
exhaustive pebbling search and against the paper's stated values (c_min 5 and 7, C_opt 6L + 1..3).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numba
import numpy as np

from recompute.planners.pebble.chain import advance, opt0_table, segment_ops
from recompute.planners.pebble.schedule import TURN, Costs, Op, OpKind, Schedule

__all__ = ["c_min", "c_opt", "join_table", "makespans", "join_dp", "revolve", "equiv_chain"]


def c_min(lengths: Sequence[int]) -> int:
    """The fewest slots that run the join, Theorem 3.3 (eq. 3.1): k for the bare turn (ℓ = 0), 2k when a
    branch has length 1, 2k + 1 otherwise.

    Why: the peak is right after the turn, holding the k' inputs of the non-empty branches, the k turn
    outputs and one slot to move forward again; a branch of length 1 back-propagates at once and frees
    its input for that move. Branches of length 0 (outside the theorem, which takes ℓ_i ≥ 1) hold no
    input of their own, hence the general k + k' (+1).
    """
    k, busy = len(lengths), sum(n > 0 for n in lengths)
    if busy == 0:
        return k
    return k + busy + (0 if 1 in lengths else 1)


def c_opt(lengths: Sequence[int]) -> int:
    """The fewest slots for the least makespan: every x_i stored once, Σ(ℓ_b + 1) (C_SNN = 6L + 3, C_CM =
    6L + 2, C_RNN = 6L + 1 in §4)."""
    return sum(n + 1 for n in lengths)


@numba.njit(cache=True)
def _join_kernel(dims: np.ndarray, strides: np.ndarray, uf: float, seg: np.ndarray,
                 opt: np.ndarray, arg_m: np.ndarray, arg_j: np.ndarray) -> None:
    """Fill ``opt[s, c]`` (flat sub-join index s, C order) in place; row 0 (ℓ' = 0) is preset.

    Increasing s is lexicographic order, so every ℓ' − j·e_m (index s − j·stride_m) is final before ℓ'.
    Ties go to the first branch, then the fewest steps.
    """
    k, cmax = len(dims), opt.shape[1] - 1
    for s in range(1, opt.shape[0]):
        for m in range(k):
            for j in range(1, (s // strides[m]) % dims[m] + 1):
                src = s - j * strides[m]
                for c in range(k + 1, cmax + 1):  # the forward phase holds the k inputs and the moving value
                    v = j * uf + opt[src, c - 1] + seg[j, c - k + 1]
                    if v < opt[s, c]:
                        opt[s, c], arg_m[s, c], arg_j[s, c] = v, m, j


@functools.lru_cache(maxsize=16)
def join_table(lengths: tuple[int, ...], cmax: int, costs: Costs = Costs()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Opt_join(ℓ', c) for every ℓ' ≤ ``lengths`` (componentwise) and 0 ≤ c ≤ cmax, with the minimising
    branch m and step count j (−1 and 0 where infeasible). Arrays are indexed ``[ℓ'_1, …, ℓ'_k, c]``.

    O(cmax·Π(ℓ_b + 1)·Σℓ_b) in a numba loop: (30, 30, 30) with 93 slots takes under a second.
    """
    k = len(lengths)
    shape = tuple(n + 1 for n in lengths)
    size = int(np.prod(shape))
    opt = np.full((size, cmax + 1), np.inf)
    arg_m = np.full(opt.shape, -1, dtype=np.int64)
    arg_j = np.zeros(opt.shape, dtype=np.int64)
    opt[0, k:] = costs.ut
    seg, _ = opt0_table(max(lengths, default=0), cmax, costs)
    strides = np.array([int(np.prod(shape[b + 1:])) for b in range(k)], dtype=np.int64)
    _join_kernel(np.array(shape, dtype=np.int64), strides, float(costs.uf), seg, opt, arg_m, arg_j)
    out = tuple(a.reshape(shape + (cmax + 1,)) for a in (opt, arg_m, arg_j))
    for a in out:
        a.setflags(write=False)
    return out


def makespans(lengths: Sequence[int], cmax: int, costs: Costs = Costs()) -> np.ndarray:
    """Opt_join(ℓ, c) for c = 0..cmax (``inf`` below c_min)."""
    lengths = tuple(int(n) for n in lengths)
    return np.array(join_table(lengths, cmax, costs)[0][lengths])


def join_dp(lengths: Sequence[int], slots: int, costs: Costs = Costs(), *, method: str = "join_dp",
            table_slots: int = 0) -> Schedule:
    """The optimal schedule of the join with branch lengths ``lengths`` in ``slots`` slots (Theorem 3.4).

    ``table_slots`` (when above ``slots``) sizes the DP table: its rows c ≤ ``slots`` do not depend on
    its size, so one cached table serves a search over every slot count up to it. Raises ValueError
    below :func:`c_min`.
    """
    lengths = tuple(int(n) for n in lengths)
    if not lengths or min(lengths) < 0:
        raise ValueError(f"need at least one branch and lengths ≥ 0, got {lengths}")
    need = c_min(lengths)
    if slots < need:
        raise ValueError(f"a join of lengths {lengths} needs at least {need} slots (Theorem 3.3), got {slots}")
    opt, arg_m, arg_j = join_table(lengths, max(slots, table_slots), costs)
    k = len(lengths)
    ops: list[Op] = []
    start = [0] * k

    def emit(rest: tuple[int, ...], c: int) -> None:
        if not any(rest):
            ops.append(TURN)
            return
        m, j = int(arg_m[rest + (c,)]), int(arg_j[rest + (c,)])
        s = start[m]
        ops.extend(advance(m, s, j))
        start[m] += j
        emit(rest[:m] + (rest[m] - j,) + rest[m + 1:], c - 1)
        ops.extend(segment_ops(m, s, j, c - k + 1, costs))

    emit(lengths, slots)
    return Schedule(lengths, tuple(ops), slots, method, float(opt[lengths + (slots,)]), costs)


def revolve(length: int, slots: int, costs: Costs = Costs()) -> Schedule:
    """Revolve: the optimal schedule of a chain of ``length`` steps plus the turn in ``slots`` slots (≥ 3,
    or 2 for one step): Theorem 3.4 with k = 1, i.e. Griewank–Walther's DP."""
    return join_dp((length,), slots, costs, method="revolve")


def equiv_chain(lengths: Sequence[int], slots: int, costs: Costs = Costs()) -> Schedule:
    """Equiv-Chain (§4c, Fig. 9a): group the k steps at the same distance from the turn into one step of
    cost k·uf / k·ub and size k, schedule that chain with Revolve in ⌊slots/k⌋ slots, and run each grouped
    operation on every branch. Balanced joins only (the paper's SNN setting)."""
    lengths = tuple(int(n) for n in lengths)
    k = len(lengths)
    if len(set(lengths)) != 1:
        raise ValueError(f"Equiv-Chain groups equal branches; got lengths {lengths}")
    chain = revolve(lengths[0], slots // k, Costs(k * costs.uf, k * costs.ub, costs.ut))
    ops: list[Op] = []
    for op in chain.ops:
        ops.extend([op] if op.kind is OpKind.TURN else [Op(op.kind, b, op.step) for b in range(k)])
    return Schedule(lengths, tuple(ops), slots, "equiv_chain", chain.makespan, costs, info={"chain_slots": slots // k})
