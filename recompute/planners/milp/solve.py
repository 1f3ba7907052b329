"""The MILP itself (Checkmate, Jain et al., MLSys 2020) assembled from a
:class:`~recompute.planners.milp.problem.Problem` and solved by HiGHS.

Variables (Checkmate §4): R[t, v] = 1 when stage t computes v; S[t, v] = 1 when the forward part of v
is kept from stage t-1 into stage t and S'[t, v] = 1 when its saved part is (the two parts are
defined under Pricing); FREE[t, i, k] = 1 when the forward part of i dies right after stage t
computes k (k is i itself or a successor of i); and U[t, k], the bytes of V's values alive while
stage t computes its k-th node (k < n). Constraints:
* frontier: R[t, t] = 1 and R[t, v] = 0 for v > t in forward stages; S[t, v] = S'[t, v] = 0 for v ≥ t there;
* dependencies: R[t, v] ≤ R[t, u] + S[t, u] for every edge (u, v) (a forward op reads forward parts);
* keeping: S[t+1, v] ≤ R[t, v] + S[t, v], R[t, v] + S[t, v] ≤ 1 (one copy at a time), and the same for S';
* the backward ops of stage t read the forward parts of N_t and the saved parts of N'_t:
  R[t, i] + S[t, i] ≥ 1 for i ∈ N_t, R[t, i] + S'[t, i] ≥ 1 for i ∈ N'_t;
* a value neither read in a backward stage nor an ancestor of one read there or later is neither
  computed nor kept there (a bound that only removes useless schedules);
* freeing: FREE[t, i, k] ≤ R[t, k], ≤ 1 - S[t+1, i] and ≤ 1 - R[t, j] for every successor j > k of i.
  Checkmate also forces FREE to 1 when all three hold; freeing only lowers U, so we keep the upper
  bounds alone (a solution that leaves a dead value unfreed is still a correct, pessimistic one);
* memory: U[t, 0] = Σ_i (S[t, i] M_i + S'[t, i] M'_i) + R[t, 0] (M_0 + M'_0) and
  U[t, k] = U[t, k-1] - Σ_i FREE[t, i, k-1] M_i + R[t, k] (M_k + M'_k)
  - M'_{k-1} (R[t, k-1] + S'[t, k-1] - S'[t+1, k-1]) [the last term unless k-1 ∈ N'_t]: a saved part
  leaves right after its node unless the stage's backward ops read it or it is kept;
* peak of each op q of node c (one row per op that differs): U[t, c] + R[t, c] X_q
  - Σ_i FREE[t, i, c] D_{q,i} + H_t ≤ B, an input whose last use in the stage is c being gone once
  the ops of c have read it for the last time (where c is not computed: U[t, c] + H_t ≤ B);
* peak of each backward event e of stage t (a backward op): H'_e + Σ_i S[t+1, i] (M_i - A_{e,i})
  + Σ_i S'[t+1, i] (M'_i - A'_{e,i}) ≤ B (in the last stage the outputs take the place of S[T]).

Objective (Checkmate's: the cost of every computation): Σ_t Σ_v T_v R[t, v]; ``overhead`` is that
minus T(V), the work done twice (Kusumoto's eq. (1) for a canonical strategy).
Without a budget the program first minimises the peak (the overhead as a tie-break of weight
10⁻⁶ M(V) in all), then the overhead at that peak.

HiGHS may start from a schedule (:func:`point` gives the program's variables for it, checked against
every row). ``scipy.optimize.milp`` takes no initial solution, so the model goes to scipy's vendored
HiGHS bindings directly (:func:`_highs`; cold through ``scipy.optimize.milp`` where they are missing).
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from recompute.planners.registry import InfeasibleBudget
from recompute.planners.milp.pricing import _last_use, _saved_delta, _stays, stage_memory
from recompute.planners.milp.problem import Problem

if TYPE_CHECKING:  # scipy (~1 s) is imported where a program is built: `import recompute` need not pay it
    from scipy.optimize import Bounds, LinearConstraint

__all__ = ["Solution", "NoSolution", "point"]

_TIE = 1e-6  # without a budget: the overhead's weight beside the peak (a fraction of M(V) in all)

_STATUS = {0: "optimal", 1: "time_limit", 2: "infeasible", 3: "unbounded", 4: "error"}


class NoSolution(RuntimeError):
    """HiGHS stopped (time limit) before it found any schedule within the budget."""


class _Rows:
    """Sparse constraint rows lo ≤ Σ coef · x[col] ≤ hi, added a block at a time."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.m = 0

    def add(self, lo: float | np.ndarray, hi: float | np.ndarray, *terms: tuple[np.ndarray, float | np.ndarray]) -> np.ndarray:
        """New rows, one per entry of the broadcast shape of the bounds and the terms' columns; returns
        their indices."""
        shape = np.broadcast_shapes(np.shape(lo), np.shape(hi), *(np.shape(c) for c, _ in terms))
        idx = self.m + np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        self.m += idx.size
        self.lo.append(np.broadcast_to(lo, shape).ravel().astype(float))
        self.hi.append(np.broadcast_to(hi, shape).ravel().astype(float))
        for col, coef in terms:
            self.term(idx, col, coef)
        return idx

    def term(self, rows: np.ndarray, col: np.ndarray, coef: float | np.ndarray) -> None:
        """Add coef · x[col] to existing rows (all three broadcast together)."""
        r, c, v = np.broadcast_arrays(rows, col, np.asarray(coef, dtype=float))
        self.rows.append(r.ravel())
        self.cols.append(c.ravel())
        self.vals.append(v.ravel())

    def constraint(self, nvars: int) -> LinearConstraint:
        import scipy.sparse as sp
        from scipy.optimize import LinearConstraint

        a = sp.csr_matrix((np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
                          shape=(self.m, nvars))
        return LinearConstraint(a, np.concatenate(self.lo), np.concatenate(self.hi))


@dataclass
class _Program:
    """The assembled program and where its variables are."""

    c: np.ndarray
    constraint: LinearConstraint
    bounds: Bounds
    integrality: np.ndarray
    r: np.ndarray  # (T, n) indices of R
    s: np.ndarray  # (T, 2n) indices of S and S'
    f: np.ndarray  # (T, pairs) indices of FREE
    u: np.ndarray  # (T, n) indices of U
    pairs: tuple[np.ndarray, np.ndarray]  # the FREE pairs (i, k)
    scale: float

    @property
    def size(self) -> tuple[int, int]:
        return self.constraint.A.shape[1], self.constraint.A.shape[0]


def _assemble(pb: Problem, budget: int | None) -> _Program:
    """Checkmate's program for ``pb`` (see the module docstring); ``budget=None``: minimise the peak."""
    from scipy.optimize import Bounds

    n, T = pb.n, 2 * pb.n
    eu, ev = pb.edges()
    pi = np.concatenate([np.arange(n), eu])  # FREE pairs (i, k): k = i or a successor of i
    pk = np.concatenate([np.arange(n), ev])
    npairs = len(pi)
    t = np.arange(T)[:, None]
    r = t * n + np.arange(n)
    s_all = T * n + t * 2 * n + np.arange(2 * n)
    s, sv = s_all[:, :n], s_all[:, n:]  # S (the forward part) and S' (the saved part)
    f = 3 * T * n + t * npairs + np.arange(npairs)
    u = 3 * T * n + T * npairs + t * n + np.arange(n)
    nvars = 3 * T * n + T * npairs + T * n + (budget is None)
    scale = float(max(int(pb.mem.sum() + pb.saved.sum()), 1))
    m, mv = pb.mem / scale, pb.saved / scale
    lo, hi = np.zeros(nvars), np.ones(nvars)
    fwd = np.arange(n)
    earlier = fwd[None, :] < fwd[:, None]  # [t, v]: v < t
    hi[r[:n][fwd[None, :] > fwd[:, None]]] = 0  # forward stage t computes nothing after t …
    lo[r[fwd, fwd]] = 1  # … and t itself
    hi[s[:n][~earlier]] = hi[sv[:n][~earlier]] = 0  # and keeps only what came before it
    hi[r[:n][earlier & pb.fixed[None, :]]] = 0  # random ops run once in the forward phase
    lo[s[:n][earlier & pb.pinned[None, :]]] = 1  # outputs live to the end
    lo[s[n:][:, pb.pinned]] = 1
    hi[sv[:, pb.saved == 0]] = 0
    hi[f[:n][(pk[None, :] > fwd[:, None])]] = 0
    hi[f[n:][pb.needs[:, pi]]] = 0  # a value the backward ops read is not freed before them
    hi[f[:, pb.pinned[pi]]] = 0
    # a value is of use in backward stage n + s only while it or a descendant is read at s or later
    below = np.eye(n, dtype=bool)
    for v in range(n):
        for w in pb.preds[v]:
            below[v] |= below[w]
    read = (pb.needs | pb.needs_saved).astype(np.int64)
    useful = np.logical_or.accumulate((read @ below > 0)[::-1], axis=0)[::-1]
    hi[r[n:][~useful]] = 0
    hi[s[n:][~useful & ~pb.pinned[None, :]]] = 0
    hi[sv[n:][~useful]] = 0
    rows = _Rows()
    rows.add(-np.inf, 0, (r[:, ev], 1), (r[:, eu], -1), (s[:, eu], -1))  # dependencies
    for keep_var, needs in ((s, pb.needs), (sv, pb.needs_saved)):
        need = np.argwhere(needs)
        rows.add(1, np.inf, (r[n + need[:, 0], need[:, 1]], 1), (keep_var[n + need[:, 0], need[:, 1]], 1))
        rows.add(-np.inf, 0, (keep_var[1:], 1), (r[:-1], -1), (keep_var[:-1], -1))  # keeping
        rows.add(-np.inf, 1, (r, 1), (keep_var, 1))
    rows.add(-np.inf, 0, (f, 1), (r[:, pk], -1))  # freeing
    rows.add(-np.inf, 1, (f[:-1], 1), (s[1:, pi], 1))
    succs = [np.flatnonzero(ev_row) for ev_row in (eu[None, :] == np.arange(n)[:, None])]
    pj = [(p, int(ev[e])) for p in range(npairs) for e in succs[pi[p]] if ev[e] > pk[p]]
    if pj:
        pp, jj = np.array(pj).T
        rows.add(-np.inf, 1, (f[:, pp], 1), (r[:, jj], 1))
    # memory: U[t, k] - U[t, k-1] - R[t, k] (M_k + M'_k) + Σ_{pairs freed after k-1} FREE M_i
    # (- S[t] · M - S'[t] · M' at k = 0); the saved part of k leaves after k unless the stage's
    # backward ops read it or it is kept: + M'_k (R[t, k] + S'[t, k] - S'[t+1, k]) at k + 1
    mem_rows = rows.add(0, 0, (u, 1))
    rows.term(mem_rows[:, 1:], u[:, :-1], -1)
    rows.term(mem_rows, r, -(m + mv))
    rows.term(mem_rows[:, [0]], s, -m)
    rows.term(mem_rows[:, [0]], sv, -mv)
    inside = pk + 1 < n  # a value freed after the last event leaves no U
    rows.term(mem_rows[:, pk[inside] + 1], f[:, inside], m[pi[inside]])
    read_here = np.vstack([np.zeros((n, n), dtype=bool), pb.needs_saved])
    tt, kk = np.nonzero(~read_here & (pb.saved > 0)[None, :] & (np.arange(n) + 1 < n)[None, :])
    rows.term(mem_rows[tt, kk + 1], r[tt, kk], mv[kk])
    rows.term(mem_rows[tt, kk + 1], sv[tt, kk], mv[kk])
    on = tt + 1 < T
    rows.term(mem_rows[tt[on], kk[on] + 1], sv[tt[on] + 1, kk[on]], -mv[kk[on]])
    # backward events: what the stage keeps into the next adds M_c − A_{e,c} (the last stage: the outputs)
    e_stage = n + pb.bwd_stage
    coef = np.hstack([pb.mem[None, :] - pb.bwd_alive[:, :n], pb.saved[None, :] - pb.bwd_alive[:, n:]]) / scale
    last = e_stage + 1 == T
    fixed_bytes = np.where(last, (coef[:, :n] * pb.pinned[None, :]).sum(1), 0.0) + pb.bwd_base / scale
    ee, cc = np.nonzero((coef > 0) & ~last[:, None])
    ok = hi[s_all[e_stage[ee] + 1, cc]] > 0
    ee, cc = ee[ok], cc[ok]
    # op peaks: U[t, c] + R[t, c] X_q - Σ_i FREE[t, i, c] D_{q,i} (an input whose last use is c is gone
    # once c has read it for the last time)
    qn = pb.peak_node
    qq, ii = np.nonzero(pb.peak_done)
    pair = {(int(a), int(b)): j for j, (a, b) in enumerate(zip(pi, pk))}
    fq = np.array([pair[(int(i), int(qn[q]))] for q, i in zip(qq, ii)], dtype=np.int64)
    hi[u] = np.inf
    if budget is None:
        peak_var = nvars - 1
        hi[peak_var] = np.inf
        peaks = rows.add(-np.inf, -pb.base[:, None] / scale, (u[:, qn], 1), (r[:, qn], pb.peak_extra[None, :] / scale),
                         (np.full((T, len(qn)), peak_var), -1))
        events = rows.add(-np.inf, -fixed_bytes, (np.full(len(e_stage), peak_var), -1))
        c = np.zeros(nvars)
        c[peak_var] = 1
        c[r] = _TIE * pb.time[None, :] / max(T * int(pb.time.sum()), 1)
    else:
        peaks = rows.add(-np.inf, (budget - pb.base[:, None]) / scale, (u[:, qn], 1),
                         (r[:, qn], pb.peak_extra[None, :] / scale))
        events = rows.add(-np.inf, budget / scale - fixed_bytes)
        c = np.zeros(nvars)
        c[r] = pb.time[None, :]
    rows.term(peaks[:, qq], f[:, fq], -pb.peak_done[qq, ii] / scale)
    rows.term(events[ee], s_all[e_stage[ee] + 1, cc], coef[ee, cc])
    lo[u] = 0
    integrality = np.zeros(nvars)
    integrality[: 3 * T * n + T * npairs] = 1
    return _Program(c, rows.constraint(nvars), Bounds(lo, hi), integrality, r, s_all, f, u, (pi, pk), scale)


@dataclass
class Solution:
    """What HiGHS returned, decoded.

    Attributes:
        status: ``optimal``, ``time_limit`` (with an incumbent), …
        R, S: (T, n) booleans (compute, keep).
        objective: the program's objective: Σ T_v R[t, v] (budget) or the peak in bytes (no budget).
        bound: HiGHS's best bound on it (the LP value for a relaxation).
        mip_gap: HiGHS's relative gap between the two.
        seconds: wall time of HiGHS.
        variables, rows: size of the program.
        least_peak: it minimised the peak (no budget): ``bound`` bounds the peak, not the overhead.
        warm: HiGHS started from a given schedule (a warm start).
    """

    status: str
    R: np.ndarray
    S: np.ndarray
    objective: float
    bound: float
    mip_gap: float
    seconds: float
    variables: int
    rows: int
    least_peak: bool
    warm: bool = False


def _highs(prog: _Program, integrality: np.ndarray, options: dict[str, Any],
           start: np.ndarray | None) -> tuple[int, np.ndarray | None, float, float, float, str]:
    """Solve with HiGHS: (status code of ``_STATUS``, x or None, objective, best bound, mip gap, message).

    ``scipy.optimize.milp`` takes no initial solution, so where scipy vendors its HiGHS bindings
    (``scipy.optimize._highspy._core``, a private module: scipy 1.17) the model is passed to them
    directly and ``start`` given to ``setSolution``; without them, ``scipy.optimize.milp`` solves it
    cold."""
    import scipy.sparse as sp

    try:
        from scipy.optimize._highspy import _core as h
    except ImportError:
        from scipy.optimize import milp as highs_milp

        res = highs_milp(prog.c, integrality=integrality, bounds=prog.bounds, constraints=prog.constraint,
                         options={**options, "disp": False})
        return (res.status, res.x, float(res.fun) if res.x is not None else np.nan,
                float(getattr(res, "mip_dual_bound", None) or res.fun or np.nan), float(getattr(res, "mip_gap", 0.0) or 0.0),
                res.message)
    a = sp.csc_matrix(prog.constraint.A)
    lp = h.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.format_ = h.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    inf = lambda x: np.clip(x, -h.kHighsInf, h.kHighsInf)  # noqa: E731
    lp.col_cost_ = prog.c
    lp.col_lower_, lp.col_upper_ = inf(prog.bounds.lb), inf(prog.bounds.ub)
    lp.row_lower_, lp.row_upper_ = inf(prog.constraint.lb), inf(prog.constraint.ub)
    if integrality.any():
        lp.integrality_ = [h.HighsVarType(int(i)) for i in integrality]
    highs = h._Highs()
    opts = h.HighsOptions()
    opts.output_flag = False
    opts.threads = 1
    for key, value in options.items():
        setattr(opts, key, value)
    highs.passOptions(opts)
    highs.passModel(lp)
    if start is not None:
        sol = h.HighsSolution()
        sol.col_value = start
        sol.value_valid = True
        highs.setSolution(sol)
    highs.run()
    status, info = highs.getModelStatus(), highs.getInfo()
    code = {h.HighsModelStatus.kOptimal: 0, h.HighsModelStatus.kTimeLimit: 1, h.HighsModelStatus.kInfeasible: 2,
            h.HighsModelStatus.kUnbounded: 3}.get(status, 4)
    message = highs.modelStatusToString(status)
    found = code == 0 or (code == 1 and info.primal_solution_status == h.kSolutionStatusFeasible)
    if not found:
        return code, None, np.nan, np.nan, np.nan, message
    x = np.array(highs.getSolution().col_value)
    mip = bool(integrality.any())
    fun = info.objective_function_value
    return code, x, fun, info.mip_dual_bound if mip else fun, info.mip_gap if mip else 0.0, message


def _solve(pb: Problem, budget: int | None, time_limit: float, mip_rel_gap: float, relax: bool = False,
           start: tuple[np.ndarray, np.ndarray] | None = None) -> Solution:
    """Assemble and solve, from the schedule ``start`` = (R, S) where it is a point of the program;
    :class:`InfeasibleBudget` when HiGHS proves no schedule fits the budget, :class:`NoSolution`
    when it stops before finding one."""
    if budget is not None and budget < pb.floor():
        raise InfeasibleBudget("milp", budget, None)
    prog = _assemble(pb, budget)
    x0 = point(pb, prog, *start) if start is not None else None
    began = _time.perf_counter()
    code, x, fun, bound, gap, message = _highs(
        prog, np.zeros_like(prog.integrality) if relax else prog.integrality,
        {"time_limit": float(time_limit), "mip_rel_gap": mip_rel_gap}, x0)
    seconds = _time.perf_counter() - began
    if code == 2:
        raise InfeasibleBudget("milp", budget, None)
    if x is None:
        raise NoSolution(f"milp: HiGHS stopped ({message}) after {seconds:.1f}s without a schedule; "
                         "raise time_limit or lower max_nodes (coarser graph)")
    unit = prog.scale if budget is None else 1.0
    return Solution(
        status=_STATUS.get(code, "error"), R=x[prog.r] > 0.5, S=x[prog.s] > 0.5, objective=float(fun) * unit,
        bound=float(bound) * unit, mip_gap=float(gap), seconds=seconds, variables=prog.size[0], rows=prog.size[1],
        least_peak=budget is None, warm=x0 is not None,
    )


def point(pb: Problem, prog: _Program, R: np.ndarray, S: np.ndarray) -> np.ndarray | None:
    """The program's variables for the schedule (R, S): FREE taken right after each value's last use
    in a stage (as :func:`stage_memory`), U from its recursion, the peak variable (no budget) at the
    schedule's peak; ``None`` where that point breaks a bound or a constraint of ``prog``."""
    n = pb.n
    pi, pk = prog.pairs
    kept, stays = _stays(pb, S)
    last = _last_use(pb, R)
    free = (~stays & (last >= 0))[:, pi] & (last[:, pi] == pk[None, :])
    delta = _saved_delta(pb, R, S)
    delta[:, :n] += R * pb.mem[None, :]
    delta[:, 0] += S[:, :n] @ pb.mem
    np.add.at(delta.T, pk + 1, -(free * pb.mem[pi]).T)
    x = np.zeros(prog.c.size)
    x[prog.r], x[prog.s], x[prog.f], x[prog.u] = R, S, free, np.cumsum(delta, axis=1)[:, :n] / prog.scale
    if prog.c.size > prog.u.max() + 1:  # no budget: the peak variable
        x[-1] = stage_memory(pb, R, S).max() / prog.scale
    ax = prog.constraint.A @ x
    tol = 1e-9
    ok = ((x >= prog.bounds.lb - tol) & (x <= prog.bounds.ub + tol)).all()
    return x if ok and ((ax >= prog.constraint.lb - tol) & (ax <= prog.constraint.ub + tol)).all() else None

