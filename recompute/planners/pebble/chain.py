"""Chains: Opt0, the optimal back-propagation of a chain segment (Griewank & Walther 2000, in the slot
model of Beaumont et al. 2020), and Chen et al.'s (2016, §4.4) recursive checkpointing.

Opt0(l, c) is the least time to back-propagate l steps of a branch when its input x_0 and the backward
data δ_l are in memory and c slots are free for the job (x_0 and δ_l included); it ends with δ_0 alone.
It is step (iv) of Beaumont's canonical form (§3a) and the backward phase of Revolve:

    Opt0(1, c) = ub                                                    c ≥ 2
    Opt0(l, c) = min_{1≤j<l} j·uf + Opt0(l − j, c − 1) + Opt0(j, c)    c ≥ 3, l ≥ 2

(advance j steps from x_0 keeping x_0, store x_j, back-propagate the last l − j steps with one slot
fewer, then the first j with all of them). In Griewank–Walther's terms c slots are s = c − 2 snapshots
(x_0 included) plus the moving value and δ; ``tests/test_chain.py`` checks Revolve against their
closed form for the number of forward steps.
"""

from __future__ import annotations

import functools

import numpy as np

from recompute.planners.pebble.schedule import TURN, Costs, Op, OpKind, Schedule, simulate

__all__ = ["opt0_table", "advance", "segment_ops", "chen_recursive"]


@functools.lru_cache(maxsize=32)
def opt0_table(lmax: int, cmax: int, costs: Costs = Costs()) -> tuple[np.ndarray, np.ndarray]:
    """Opt0(l, c) for 0 ≤ l ≤ lmax, 0 ≤ c ≤ cmax (``inf`` where infeasible, and for l = 0) and the
    minimising j (0 where none). Row l is one vectorised min over j and every c at once."""
    opt = np.full((lmax + 1, cmax + 1), np.inf)
    arg = np.zeros((lmax + 1, cmax + 1), dtype=np.int64)
    if lmax >= 1:
        opt[1, 2:] = costs.ub
    for l in range(2, lmax + 1):
        j = np.arange(1, l)
        # cand[j-1, c-1] = j·uf + Opt0(l − j, c − 1) + Opt0(j, c), for c = 1..cmax
        cand = j[:, None] * costs.uf + opt[l - j, :-1] + opt[j, 1:]
        best = cand.argmin(axis=0)
        cols = np.arange(cmax)
        opt[l, 1:] = cand[best, cols]
        arg[l, 1:] = np.where(np.isfinite(opt[l, 1:]), j[best], 0)
    opt.setflags(write=False)
    arg.setflags(write=False)
    return opt, arg


def advance(branch: int, start: int, steps: int) -> list[Op]:
    """Run ``steps`` forward steps from x_start, keeping x_start (``Fck``) and moving the new value along
    the branch in one slot (``F∅``): memory gains exactly x_{start+steps}."""
    return [Op(OpKind.F_CK if i == 1 else OpKind.F_NONE, branch, start + i) for i in range(1, steps + 1)]


def segment_ops(branch: int, start: int, length: int, slots: int, costs: Costs = Costs()) -> list[Op]:
    """The operations of Opt0(``length``, ``slots``) on steps start+1..start+length of ``branch``.

    Raises ValueError when ``slots`` are too few (2 for one step, 3 for more)."""
    opt, arg = opt0_table(length, slots, costs)
    if not np.isfinite(opt[length, slots]):
        raise ValueError(f"back-propagating {length} steps needs at least {2 if length == 1 else 3} slots, got {slots}")
    ops: list[Op] = []

    def emit(s: int, n: int, c: int) -> None:
        if n == 1:
            ops.append(Op(OpKind.B, branch, s + 1))
            return
        j = int(arg[n, c])
        ops.extend(advance(branch, s, j))
        emit(s + j, n - j, c - 1)
        emit(s, j, c)

    emit(start, length, slots)
    return ops


def _cuts(start: int, end: int, k: int) -> list[int]:
    """The k points splitting start..end into k + 1 near-equal parts (fewer on a short segment)."""
    n = end - start
    return sorted({start + i * n // (k + 1) for i in range(1, k + 1)} - {start, end})


def chen_recursive(length: int, k: int = 1, costs: Costs = Costs()) -> Schedule:
    """Chen et al. (2016) §4.4 on a chain: store k evenly spaced values, then treat each of the k + 1
    parts as one bulk operator whose backward runs the same scheme inside it, so the memory is
    g(n) = k + g(n/(k + 1)) = k·log_{k+1}(n) (their eqs. 2–3) plus the slots of the bottom level.

    The last part is handled first and carries the turn; the schedule's ``slots`` is its peak.
    """
    if length < 0 or k < 1:
        raise ValueError(f"need length ≥ 0 and k ≥ 1, got {length}, {k}")
    ops: list[Op] = []

    def store(s: int, cuts: list[int]) -> None:
        for a, b in zip([s, *cuts], cuts):
            ops.extend(advance(0, a, b - a))

    def back(s: int, e: int) -> None:  # x_s and δ_e held → δ_s
        if e - s == 1:
            ops.append(Op(OpKind.B, 0, e))
            return
        cuts = _cuts(s, e, k)
        store(s, cuts)
        for a, b in zip(reversed([s, *cuts]), reversed([*cuts, e])):
            back(a, b)

    def top(s: int, e: int) -> None:  # x_s held, the turn at e → δ_s
        if s == e:
            ops.append(TURN)
            return
        cuts = _cuts(s, e, k)
        if not cuts:  # one step: run it, turn, back-propagate it
            ops.extend(advance(0, s, 1))
            ops.append(TURN)
            back(s, e)
            return
        store(s, cuts)
        top(cuts[-1], e)
        for a, b in zip(reversed([s, *cuts[:-1]]), reversed(cuts)):
            back(a, b)

    top(0, length)
    # no bound to plan for: its peak is what it needs (at most one value per operation plus the input)
    draft = Schedule((length,), tuple(ops), slots=len(ops) + 1, method="chen_recursive", makespan=0.0, costs=costs)
    sim = simulate(draft)
    return Schedule((length,), draft.ops, slots=sim.peak_slots, method="chen_recursive", makespan=sim.makespan,
                    costs=costs, info={"k": k})
