"""``exactdp`` and ``approxdp``: the DP of Kusumoto et al. (2019), §4.2–4.4, over a family of lower sets.

Both planners run one DP core (:func:`_solve`) and differ only in the family of lower sets it may
use: ``exactdp`` takes every lower set of G (§4.2), ``approxdp`` the pruned family
{L_v | v ∈ V} ∪ {∅, V} (§4.3).

The DP table is opt[L, t] = min m, where t is the overhead of a prefix L_1 ≺ … ≺ L_i = L (eq. 1,
without the never-recomputed last block V_k) and m = M(U_i) is the memory of the boundaries cached so
far. A transition L ⊊ L′ with block V′ = L′ \\ L is allowed iff the eq. (2) term fits:

    m + 2 M(V′) + M(δ⁺(L′) \\ L′) + M(δ⁻(δ⁺(L′)) \\ L′) ≤ B,

and leads to m′ = m + M(∂(L′) \\ L) (∂(L′) ∩ L ⊆ ∂(L) is already cached) and t′ = t + T(V′ \\ ∂(L′)),
or t′ = t for L′ = V. Only the Pareto frontier of (t, m) per L is expanded (§4.2's pruning): for the
time-centric strategy (tc) a state is dominated by one with smaller t and no larger m, for the
memory-centric strategy (mc, §4.4: most overhead within the budget) by one with larger t and no larger
m. Lower sets are visited by (M(L), |L|), an order compatible with inclusion.

With ``budget=None`` the planners use the smallest budget B* that admits a canonical strategy, found
exactly in integer bytes by a search over feasibility runs of the same core (:func:`_min_budget`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numba
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from recompute.core.families import all_lower_sets, has as _has, pack_rows, pruned_family, unpack_rows
from recompute.pricing.blockcost import BlockCosts, FamilyCosts, _pair_cost
from recompute.core.graph import Graph
from recompute.pricing.memory_model import PLANNING, MemoryModel
from recompute.pricing.schedule import rng_order_preds
from recompute.planners.registry import InfeasibleBudget, Plan, register

__all__ = ["exactdp", "approxdp"]

_INF = np.iinfo(np.int64).max // 4  # "no state"; far above any sum of byte counts we add to it


# ---------------------------------------------------------------------------------------------------
# Per-lower-set costs and the DP core (numba: the loops over pairs L ⊊ L′ are the whole cost).


@numba.njit(cache=True)
def _set_costs(bits, mem, weight, inner, extra, time, succ_ptr, succ_idx, pred_ptr, pred_idx):
    """Per lower set L: W(L) (the block weight, 2 M(L) for eq. 2), T(L),
    c(L) = M(δ⁺(L) \\ L) + X(δ⁻(δ⁺(L)) \\ L) + extra (X = ``inner``: M for eq. 2), and two node lists
    (CSR over the sets): ∂(L), and the minimal nodes of V \\ L (v ∉ L with δ⁻({v}) ⊆ L)."""
    k, n = bits.shape[0], mem.shape[0]
    msum = np.zeros(k, np.int64)
    tsum = np.zeros(k, np.int64)
    cterm = np.zeros(k, np.int64)
    bd_ptr = np.zeros(k + 1, np.int64)
    mo_ptr = np.zeros(k + 1, np.int64)
    bd_idx = np.empty(4 * k + 16, np.int64)
    mo_idx = np.empty(4 * k + 16, np.int64)
    seen_above = np.full(n, -1, np.int64)  # stamps: "already counted for set r"
    seen_in = np.full(n, -1, np.int64)
    for r in range(k):
        bd_idx = _grow(bd_idx, bd_ptr[r] + n)
        mo_idx = _grow(mo_idx, mo_ptr[r] + n)
        nb, nm = bd_ptr[r], mo_ptr[r]
        for u in range(n):
            if not _has(bits, r, u):
                minimal = True
                for f in range(pred_ptr[u], pred_ptr[u + 1]):
                    minimal = minimal and _has(bits, r, pred_idx[f])
                if minimal:
                    mo_idx[nm] = u
                    nm += 1
                continue
            msum[r] += weight[u]
            tsum[r] += time[u]
            read_outside = False
            for e in range(succ_ptr[u], succ_ptr[u + 1]):
                w = succ_idx[e]
                if _has(bits, r, w):
                    continue
                read_outside = True
                if seen_above[w] != r:  # w ∈ δ⁺(L) \ L
                    seen_above[w] = r
                    cterm[r] += mem[w]
                    for f in range(pred_ptr[w], pred_ptr[w + 1]):
                        p = pred_idx[f]
                        if seen_in[p] != r and not _has(bits, r, p):  # p ∈ δ⁻(δ⁺(L)) \ L
                            seen_in[p] = r
                            cterm[r] += inner[p]
            if read_outside:  # u ∈ ∂(L)
                bd_idx[nb] = u
                nb += 1
        bd_ptr[r + 1], mo_ptr[r + 1] = nb, nm
        cterm[r] += extra
    return msum, tsum, cterm, bd_ptr, bd_idx[: bd_ptr[k]].copy(), mo_ptr, mo_idx[: mo_ptr[k]].copy()


@numba.njit(cache=True)
def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), a.dtype)
    b[: a.shape[0]] = a
    return b


@numba.njit(cache=True)
def _first_at_least(key: np.ndarray, sign: int, lo: int, hi: int, limit: int) -> int:
    """The first q in [lo, hi) with sign·key[q] ≥ limit (sign·key increasing there), or hi."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if sign * key[mid] >= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


class FamilyArrays(NamedTuple):
    """What the DP core reads of a lower-set family, as arrays (a record numba takes as one argument)."""

    bits: np.ndarray  # the family's sets as bitsets, sorted by (W(L), |L|), ∅ first, V last
    contains: np.ndarray  # bit r of row v: v ∈ L_r
    msum: np.ndarray  # W(L) per set
    tsum: np.ndarray  # T(L) per set
    cterm: np.ndarray  # the block term's part fixed by L′ (the nodes above it)
    bd_ptr: np.ndarray  # ∂(L) per set (CSR)
    bd_idx: np.ndarray
    mo_ptr: np.ndarray  # the minimal nodes of V \ L per set (CSR)
    mo_idx: np.ndarray
    mem: np.ndarray  # M_v
    hold: np.ndarray  # what a cached node keeps beyond X
    weight: np.ndarray
    floor: np.int64  # a constant of every block term
    time: np.ndarray  # T_v


class Search(NamedTuple):
    """One run's bounds: the budget, the window of sets looked at, t's quantum and row length, mc or tc,
    and whether the block term is the simulator's (``exact``)."""

    budget: np.int64
    window_budget: np.int64
    quantum: np.int64
    row_len: np.int64
    most: bool
    exact: bool


@numba.njit(cache=True)
def _dp_core(family, search, pairs, known):
    """Fill opt[L, t] over the family (:class:`FamilyArrays`: rows of ``bits``, sorted by (M(L), |L|), ∅
    first, V last) under ``search`` (:class:`Search`).

    States are stored per lower set as its Pareto frontier, ordered by decreasing m, in flat arrays
    (``start[r]:stop[r]``): t (quantised by ``quantum``), m = M(U), the predecessor state, the set, and
    the eq. (2) peak along the back-pointer path. ``most`` selects mc's dominance (larger t is better).

    The sets L ⊊ L′ come from the bitsets over the family in ``contains`` (bit r of row v: v ∈ L_r):
    a lower set L lies inside L′ iff it misses every minimal node of V \\ L′. Only rows with
    W(L′) − W(L) + c(L′) ≤ window_budget are looked at; in (W, |L|) order they form a contiguous run.
    (``msum`` holds W; the block term is W(L′) − W(L) plus ``hold`` summed over the newly cached
    boundary ∂(L′) \\ L: 0 for eq. 2, M_v − S_v for the liveness model, whose cached values are whole.)
    With ``exact`` the block term is the simulator's B(L, L′) (:mod:`recompute.pricing.blockcost`, arguments
    ``pairs``), memoised in ``known`` across runs; W(L′) − W(L) + c(L′) is then a lower bound of it.

    L′'s frontier is built lazily: the transitions into it are taken from a heap by increasing m′
    (ties: the preferred t′ first), and one can enter the frontier only if its t′ is preferred to that
    of every state accepted before it. Each L contributes the least-m′ state of its frontier that can,
    so the block term (the simulator's, the costly part) is evaluated only for such transitions, and
    once B(L, L′) exceeds the budget L is done (its further states have larger m).

    Returns the frontier arrays and ``next_budget``: the least block term (or its lower bound) among
    the examined transitions that the budget rejected; every budget in [budget, next_budget) gives the
    same frontiers (a transition not examined is dominated by an accepted one at any larger budget).
    """
    bits, contains, msum, tsum, cterm, bd_ptr, bd_idx, mo_ptr, mo_idx, mem, hold, weight, floor, time = family
    budget, window_budget, quantum, row_len, most, exact = search
    k = bits.shape[0]
    half = quantum // 2
    ones = ~np.uint64(0)
    sign = -1 if most else 1  # sign·t is smaller for the preferred t and increases along a frontier
    cap = 4 * k + 16
    pt_t = np.empty(cap, np.int64)
    pt_m = np.empty(cap, np.int64)
    pt_prev = np.empty(cap, np.int64)
    pt_set = np.empty(cap, np.int64)
    pt_peak = np.empty(cap, np.int64)
    start = np.zeros(k, np.int64)
    stop = np.zeros(k, np.int64)
    pt_t[0], pt_m[0], pt_prev[0], pt_set[0], pt_peak[0] = 0, 0, -1, 0, 0  # opt[∅, 0] = 0
    stop[0] = 1
    n_pts = 1
    # Per L in L′'s heap (a slot): the set, its first state within the bound, its current state, Δm,
    # Δt, the block term (−1: not evaluated yet). Accepted states: (state, m′, t′, term).
    s_set, s_lo, s_q = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64)
    s_dm, s_dt, s_fixed = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64)
    acc = np.empty((cap, 4), np.int64)
    heap = [(np.int64(0), np.int64(0), np.int64(0))]
    heap.pop()
    no_bound = np.int64(1) if most else np.int64(row_len)  # sign·t′ < no_bound: t′ ≥ 0 (mc), t′ < row_len (tc)
    next_budget = _INF
    for j in range(1, k):
        # W(L) ≥ W(L′) + c(L′) − window_budget, since m ≥ 0 and hold ≥ 0.
        need = msum[j] + cterm[j] - window_budget
        first = np.searchsorted(msum[:j], need if need > 0 else np.int64(-1))
        ns = 0
        for wi in range(first >> 6, ((j - 1) >> 6) + 1 if j > first else first >> 6):
            base = wi << 6
            word = ones
            for e in range(mo_ptr[j], mo_ptr[j + 1]):
                word &= ~contains[mo_idx[e], wi]
            if base < first:
                word &= ones << np.uint64(first - base)
            if base + 64 > j:
                word &= (np.uint64(1) << np.uint64(j - base)) - np.uint64(1)
            while word:
                i = base + trailing_zeros(word)
                word &= word - np.uint64(1)
                if start[i] == stop[i]:
                    continue  # unreachable within the budget
                # ∂(L′) \ L: newly cached; ∂(L′) ∩ L is in ∂(L), already cached.
                dm, dh, dt_bd, ds = np.int64(0), np.int64(0), np.int64(0), np.int64(0)
                for e in range(bd_ptr[j], bd_ptr[j + 1]):
                    v = bd_idx[e]
                    if not _has(bits, i, v):
                        dm += mem[v]
                        dh += hold[v]
                        ds += weight[v]
                        dt_bd += time[v]
                if exact:  # a lower bound of the simulator's block memory minus M(U_{i-1}): the cache
                    # of V′ is whole (K ≥ S) in the backward phase
                    fixed = np.int64(-1)
                    lower = msum[j] - msum[i] + cterm[j] + (dm - ds if cterm[j] > floor else 0)
                else:
                    fixed = msum[j] - msum[i] + cterm[j] + dh  # eq. (2) minus M(U_{i-1})
                    lower = fixed
                dt = np.int64(0) if j == k - 1 else (tsum[j] - tsum[i] - dt_bd + half) // quantum
                # L's frontier by decreasing m: the states within the budget are a suffix [lo, stop).
                lo = _first_at_least(pt_m, -1, start[i], stop[i], lower - budget)
                if lo > start[i] and pt_m[lo - 1] + lower < next_budget:
                    next_budget = pt_m[lo - 1] + lower
                q = _first_at_least(pt_t, sign, lo, stop[i], no_bound - sign * dt) - 1
                if q < lo:
                    continue
                s_set[ns], s_lo[ns], s_q[ns], s_dm[ns], s_dt[ns], s_fixed[ns] = i, lo, q, dm, dt, fixed
                heapq.heappush(heap, (pt_m[q] + dm, sign * (pt_t[q] + dt), np.int64(ns)))
                ns += 1
        start[j] = n_pts
        bound = no_bound
        n_acc = 0
        while heap:
            m2, st2, s = heapq.heappop(heap)
            q = s_q[s]
            if st2 < bound:
                if s_fixed[s] < 0:
                    key = s_set[s] * k + j
                    if key in known:
                        s_fixed[s] = known[key]
                    else:
                        s_fixed[s] = _pair_cost(s_set[s], j, *pairs)
                        known[key] = s_fixed[s]
                term = pt_m[q] + s_fixed[s]
                if term > budget:
                    if term < next_budget:
                        next_budget = term
                    continue
                bound = st2
                if n_acc == acc.shape[0]:
                    grown = np.empty((2 * n_acc, 4), np.int64)
                    grown[:n_acc] = acc
                    acc = grown
                acc[n_acc, 0], acc[n_acc, 1], acc[n_acc, 2], acc[n_acc, 3] = q, m2, sign * st2, term
                n_acc += 1
            # L's next state that can still enter: larger m, sign·t′ below the bound
            q = _first_at_least(pt_t, sign, s_lo[s], q, bound - sign * s_dt[s]) - 1
            if q >= s_lo[s]:
                s_q[s] = q
                heapq.heappush(heap, (pt_m[q] + s_dm[s], sign * (pt_t[q] + s_dt[s]), s))
        if n_pts + n_acc > pt_t.shape[0]:
            need_cap = n_pts + n_acc
            pt_t, pt_m = _grow(pt_t, need_cap), _grow(pt_m, need_cap)
            pt_prev, pt_set, pt_peak = _grow(pt_prev, need_cap), _grow(pt_set, need_cap), _grow(pt_peak, need_cap)
        for a in range(n_acc - 1, -1, -1):  # accepted by increasing m′; stored by decreasing m
            q = acc[a, 0]
            pt_t[n_pts], pt_m[n_pts], pt_prev[n_pts], pt_set[n_pts] = acc[a, 2], acc[a, 1], q, j
            pt_peak[n_pts] = max(pt_peak[q], acc[a, 3])
            n_pts += 1
        stop[j] = n_pts
    return pt_t[:n_pts], pt_m[:n_pts], pt_prev[:n_pts], pt_set[:n_pts], pt_peak[:n_pts], start, stop, next_budget


# ---------------------------------------------------------------------------------------------------
# Python side: the family's costs, one DP run, the smallest-budget search, the planners.


@dataclass
class _Family:
    """A family of lower sets (by (W(L), |L|): ∅ first, V last) with the per-set costs the DP needs
    under a memory model (``msum`` holds W; ``mem`` is what a cached node adds to M(U))."""

    g: Graph
    bits: np.ndarray
    contains: np.ndarray
    msum: np.ndarray
    tsum: np.ndarray
    cterm: np.ndarray
    bd_ptr: np.ndarray
    bd_idx: np.ndarray
    mo_ptr: np.ndarray
    mo_idx: np.ndarray
    mem: np.ndarray
    hold: np.ndarray
    weight: np.ndarray  # W_v
    floor: int = 0  # c(L′) of a weak L′ (simulator)
    pairs: tuple | None = None  # the simulator's block costs (MemoryModel.simulator)
    known: Any = None
    # _min_budget's answers by (hi, lo): feasibility ignores t, so one family has one B* however
    # often it is planned (a budget search plans it many times)
    min_budgets: dict[tuple[int | None, int], tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def build(cls, g: Graph, bits: np.ndarray, memory_model: MemoryModel = MemoryModel.paper) -> "_Family":
        """Order the sets by (W(L), |L|): compatible with inclusion (W_v ≥ 0), and the sets a lower
        set L′ can be reached from within a budget form a contiguous run of rows just before it.

        A formula's terms are :meth:`MemoryModel.dp_terms` (eq. 2: W = 2 M, X = M, no extra, hold = 0;
        liveness: W = X = S, extra = 2 max M, hold = M − S). Simulator (:mod:`recompute.pricing.blockcost`): the block
        term is B(L, L′), M(U) sums the cache bytes K_v, and W(L′) − W(L) + c(L′) is the lower bound
        of :func:`_simulator_bound`."""
        def csr(lists: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
            ptr = np.zeros(len(lists) + 1, np.int64)
            ptr[1:] = np.cumsum([len(x) for x in lists])
            idx = np.fromiter((u for x in lists for u in x), np.int64, count=int(ptr[-1]))
            return ptr, idx

        blocks = None
        memory_model = MemoryModel.parse(memory_model, choices=PLANNING)
        if memory_model == MemoryModel.simulator:
            blocks = BlockCosts.of(g)
            if blocks is None:
                raise ValueError(f"memory_model={memory_model.value!r}: this graph's backward reads forward values "
                                 "the block decomposition does not cover; plan it with "
                                 f"memory_model={MemoryModel.liveness.value!r}")
            weight, inner, extra, hold = blocks.saved, np.zeros_like(g.mem), 0, np.zeros_like(g.mem)
        else:
            weight, inner, extra, hold = memory_model.dp_terms(g)
        member = unpack_rows(bits, g.n)
        order = np.lexsort((member.sum(axis=1), member @ weight))
        bits, contains = np.ascontiguousarray(bits[order]), pack_rows(member[order].T)
        costs = _set_costs(bits, g.mem, weight, inner, np.int64(extra), g.time, *csr(g.succs), *csr(g.preds))
        fam = cls(g, bits, contains, *costs, mem=g.mem, hold=np.ascontiguousarray(hold), weight=np.ascontiguousarray(weight))
        if blocks is not None:
            bd = np.zeros((len(bits), g.n), bool)
            for r in range(len(bits)):
                bd[r, fam.bd_idx[fam.bd_ptr[r]: fam.bd_ptr[r + 1]]] = True
            pairs = blocks.family(bits, pack_rows(bd))
            fam.cterm = _simulator_bound(g, blocks, member[order], bd, pairs)
            fam.mem, fam.pairs, fam.floor = blocks.cache, pairs.kernel_args(), blocks.constant
            fam.known = _no_known()
        return fam

    def __len__(self) -> int:
        return len(self.bits)

    def lower_set(self, r: int) -> frozenset[int]:
        return frozenset(map(int, np.flatnonzero(unpack_rows(self.bits[r : r + 1], self.g.n)[0])))


_NO_PAIRS = FamilyCosts.empty().kernel_args()


def _no_known() -> Any:
    return numba.typed.Dict.empty(numba.types.int64, numba.types.int64)


def _simulator_bound(g: Graph, blocks: BlockCosts, member: np.ndarray, boundary: np.ndarray,
                     pairs: FamilyCosts) -> np.ndarray:
    """c(L′) with B(L, L′) ≥ S(L′ \\ L) + c(L′) (S: ``BlockCosts.saved``): once the block's backward
    phase has a step, everything made before it that it or a later block reads is alive at its first
    backward op, with the recomputed values that op's block reads. V′ holds a maximal node u of L′;
    the phase has a step unless u is cached (u ∈ ∂(L′)) and owns no backward op, and for such *weak*
    L′ (or V with such an output) only the constant bytes are certain."""
    sizes = blocks.st_size[pairs.crossing_idx]
    crossing = np.zeros(len(member), np.int64)
    rows = np.repeat(np.arange(len(member)), np.diff(pairs.crossing_ptr))
    np.add.at(crossing, rows, sizes)
    succ = np.zeros((g.n, g.n), np.float32)
    for u, ws in enumerate(g.succs):
        succ[u, list(ws)] = 1.0
    maximal = member & ((member.astype(np.float32) @ succ.T) == 0)
    no_own = ~blocks.has_own
    weak = (maximal & no_own & boundary).any(axis=1)
    weak[-1] = (maximal[-1] & no_own).any()
    full = blocks.constant + blocks.tangents + blocks.out_total + pairs.before + crossing
    return np.where(weak, blocks.constant, full).astype(np.int64)


@dataclass
class _Run:
    """One DP run: the sequence it found (indices into the family, or None) and what the search needs."""

    seq: list[int] | None
    t: int
    peak: int
    next_budget: int


def _run(fam: _Family, budget: int, *, quantum: int | None, most: bool = False,
         window_budget: int | None = None, t_cap: int | None = None) -> _Run:  # fmt: skip
    """Run the DP core at ``budget``; ``quantum=None`` drops t (a feasibility run: min M(U) per set).

    States with quantised t > ``t_cap`` are dropped (tc only: t never decreases along a sequence).
    """
    g = fam.g
    if quantum is None:
        quantum, row_len = np.iinfo(np.int64).max // 4, 1  # every Δt quantises to 0
    else:
        row_len = _t_limit(fam.g, quantum) + 1 if t_cap is None else t_cap + 1
    family = FamilyArrays(fam.bits, fam.contains, fam.msum, fam.tsum, fam.cterm, fam.bd_ptr, fam.bd_idx, fam.mo_ptr,
                          fam.mo_idx, fam.mem, fam.hold, fam.weight, np.int64(fam.floor), g.time)
    search = Search(np.int64(budget), np.int64(budget if window_budget is None else window_budget), np.int64(quantum),
                    np.int64(row_len), most, fam.pairs is not None)
    out = _dp_core(family, search, fam.pairs if fam.pairs is not None else _NO_PAIRS,
                   fam.known if fam.known is not None else _no_known())
    pt_t, _, pt_prev, pt_set, pt_peak, start, stop, next_budget = out
    last = len(fam) - 1
    if start[last] == stop[last]:
        return _Run(None, 0, 0, int(next_budget))
    q = int(start[last])  # the first state of V's frontier: least t (tc) or most t (mc)
    t, peak, seq = int(pt_t[q]), int(pt_peak[q]), []
    while q > 0:  # state 0 is opt[∅, 0]
        seq.append(int(pt_set[q]))
        q = int(pt_prev[q])
    return _Run(seq[::-1], t, peak, int(next_budget))


def _min_budget(fam: _Family, hi: int | None = None, lo: int = 0) -> tuple[int, int]:
    """Smallest integer budget B* with a canonical strategy over the family, and the number of runs.

    Feasibility is monotone in B, so this is a bisection on integers that jumps: a feasible run at B
    lowers ``hi`` to the eq. (2) peak of the strategy it found (≤ B), an infeasible one raises ``lo``
    to the least rejected term (no smaller budget admits anything more). ``hi`` defaults to vanilla's
    peak (the single transition ∅ → V: 2 M(V) for eq. 2); only pairs within ``hi`` are examined.
    """
    key = hi, lo
    if key in fam.min_budgets:
        return fam.min_budgets[key]
    if hi is None:  # vanilla's peak: the single transition ∅ → V
        last = len(fam) - 1
        hi = int(_pair_cost(0, last, *fam.pairs)) if fam.pairs is not None else int(fam.msum[-1] + fam.cterm[-1])
    steps = 0
    while lo < hi:
        mid = (lo + hi) // 2
        run = _run(fam, mid, quantum=None, window_budget=hi)
        steps += 1
        if run.seq is not None:
            hi = run.peak
        else:
            lo = max(mid + 1, min(run.next_budget, hi))
    fam.min_budgets[key] = hi, steps
    return hi, steps


def _solve(g: Graph, fam: _Family, method: str, budget: int | None, strategy: str | None,
           time_levels: int, memory_model: MemoryModel, seed: _Family | None = None) -> Plan:  # fmt: skip
    """The DP of §4.2 over ``fam``.

    ``seed`` is a cheap subfamily of ``fam`` (approxdp's, for exactdp): its smallest budget bounds the
    B* search from above, and its tc optimum, computed with the same quantised Δt, bounds t for tc.
    """
    strategy = strategy or "tc"
    if strategy not in ("tc", "mc"):
        raise ValueError(f"{method}: unknown strategy {strategy!r}; use 'tc' or 'mc'")
    info: dict = {"lower_sets": len(fam)}

    def min_budget(lo: int = 0) -> tuple[int, int]:
        upper = _min_budget(seed)[0] if seed is not None else None
        return _min_budget(fam, hi=upper, lo=lo)

    smallest = None
    if budget is None:
        budget, info["search_runs"] = min_budget()
        smallest = budget
    budget = int(budget)
    # t is exact below time_levels; above, it is quantised, each of the ≤ #V transitions rounding Δt by
    # at most quantum/2, so the plan's overhead is within #V·quantum of the optimum (reported).
    quantum = max(1, math.ceil(g.total_time() / time_levels))
    info["time_quantum"] = quantum
    info["time_error_bound"] = 0 if quantum == 1 else g.n * quantum
    if strategy == "tc":
        # t only grows along a sequence, so a run that drops states with t > cap finds t* if t* ≤ cap,
        # keeping at most cap + 1 states per lower set. Caps 0, 3, 15, … up to a known bound on t*:
        # the seed's tc plan, which exists in fam with the same quantised t.
        hint = _run(seed, budget, quantum=quantum) if seed is not None else None
        limit = hint.t if hint is not None and hint.seq is not None else _t_limit(g, quantum)
        cap, info["cap_runs"] = 0, 0
        while True:
            run = _run(fam, budget, quantum=quantum, t_cap=min(cap, limit))
            info["cap_runs"] += 1
            if run.seq is not None or cap >= limit:
                break
            cap = 4 * cap + 3
    else:
        run = _run(fam, budget, quantum=quantum, most=True)
    if run.seq is None:
        raise InfeasibleBudget(method, budget, min_budget(lo=budget + 1)[0])
    info["dp_overhead"] = run.t * quantum  # the DP's own (quantised) value of eq. (1)
    seq = [fam.lower_set(r) for r in run.seq]
    return Plan.from_sequence(g, seq, method=method, strategy=strategy, budget=budget,
                              memory_model=memory_model, min_budget=smallest, **info)


def _t_limit(g: Graph, quantum: int) -> int:
    """The largest quantised t of a sequence: each of its ≤ #V transitions rounds Δt/quantum by ≤ ½."""
    return g.total_time() // quantum + g.n // 2 + 1


# t's resolution: T(V)/2¹². In the paper's units every zoo network's T(V) is below 2¹² (DenseNet-161's
# 2014 the largest), so its overheads are exact; measured seconds and FLOPs are quantised to 1/4096 of
# the forward time, finer than they are measured. A Pareto state per distinct t made a finer default
# slow there: at 2²⁰, one budget of DenseNet-161's compiled step in measured seconds took 14 minutes.
TIME_LEVELS = 1 << 12


def _memory_model(g: Graph, memory_model: str | None) -> MemoryModel:
    """The DPs' memory: the simulator (default on a traced graph: B(L, L′) of
    :mod:`recompute.pricing.blockcost`, so the plan's peak is the simulated — and measured — one), eq. (2)
    (the default on a graph built from edges) or its liveness variant (:class:`MemoryModel`)."""
    if memory_model is None:
        # a trace the block decomposition does not cover is planned with the liveness model and
        # priced by the simulator afterwards (recompute.plan)
        if g.program is not None and BlockCosts.of(g) is None:
            return MemoryModel.liveness
        return MemoryModel.default(g)
    return MemoryModel.parse(memory_model, choices=PLANNING)


def _family(g: Graph, memory_model: MemoryModel, sets: Callable[[], np.ndarray], key: tuple) -> _Family:
    """The family ``sets()`` under ``memory_model``; on a traced graph kept on its program, so that the
    simulator's block costs, once computed, serve every later solve (other budgets, strategies). Graphs
    of one program may differ in their costs (another cost model): the family's sums are of its own."""
    if g.program is None:
        return _Family.build(g, sets(), memory_model)
    families = g.program.__dict__.setdefault("dp_families", {})
    full = (memory_model, *key, g.time.tobytes(), g.mem.tobytes())
    if full not in families:
        families[full] = _Family.build(g, sets(), memory_model)
    return families[full]


def _order(g: Graph, memory_model: MemoryModel) -> Graph:
    """The graph whose lower sets the DP searches: G itself, or for the simulator G with random ops
    chained in their traced order, whose canonical forward phase runs block by block
    (:func:`recompute.pricing.schedule.forward_order`), as B(L, L′) assumes."""
    if memory_model != MemoryModel.simulator:
        return g
    preds = rng_order_preds(g)
    return g if preds == g.preds else Graph(preds, g.mem, g.time, g.names, g.ops, g.outputs)


@register("exactdp", searches_budget=True, simulator_default=True)
def exactdp(
    g: Graph,
    *,
    budget: int | None = None,
    strategy: str | None = None,
    max_lower_sets: int = 200_000,
    time_levels: int = TIME_LEVELS,
    memory_model: str | None = None,
) -> Plan:
    """Exact DP of §4.2 over all lower sets of G (time-centric ``tc`` or memory-centric ``mc``, §4.4).

    Raises :class:`recompute.core.families.TooManyLowerSets` when G has more than ``max_lower_sets`` lower sets. With
    ``budget=None`` the budget is the smallest one that admits a canonical strategy. approxdp's family
    {L_v} is a subfamily of all lower sets, so its answers bound the exact ones and prune the search.
    ``memory_model``: see :func:`_memory_model`.
    """
    memory_model = _memory_model(g, memory_model)
    order = _order(g, memory_model)
    fam = _family(g, memory_model, lambda: all_lower_sets(order, max_lower_sets), ("all", max_lower_sets))
    seed = _family(g, memory_model, lambda: pruned_family(order), ("pruned",))
    return _solve(g, fam, "exactdp", budget, strategy, time_levels, memory_model, seed=seed)


@register("approxdp", searches_budget=True, simulator_default=True)
def approxdp(g: Graph, *, budget: int | None = None, strategy: str | None = None, time_levels: int = TIME_LEVELS,
             memory_model: str | None = None) -> Plan:  # fmt: skip
    """Approximate DP of §4.3 over the pruned family {L_v | v ∈ V} ∪ {∅, V} (``tc`` or ``mc``, §4.4)."""
    memory_model = _memory_model(g, memory_model)
    fam = _family(g, memory_model, lambda: pruned_family(_order(g, memory_model)), ("pruned",))
    return _solve(g, fam, "approxdp", budget, strategy, time_levels, memory_model)
