"""The ``milp`` planner: the least recomputation within a budget over every schedule of the stage grid,
solved by :mod:`~recompute.planners.milp.solve`, fitted to the simulator.

The plan's ``peak`` is the simulator's exact peak of the
schedule that runs. Where the plan's simulated peak misses the budget the program's budget is moved
by the excess (or slack) and the program solved again, up to ``retries`` times (bisecting once a
budget that fits and one that does not are known); the plan is the least overhead that fits
(``info["milp_budget"]``).

Warm start. HiGHS starts from a heuristic schedule (``warm_start``: lower-set plans, by default
approxdp-TC's at the budget): :func:`on_demand` keeps the plan's cache U_k and its last block from the
forward pass (a coarse node kept when all its nodes are; where one mixes kept and recomputed nodes,
also the variant keeping it when any is), and each backward stage computes what its backward ops
read and is not there, keeping each value exactly while a later stage reads it (:func:`point` gives
the program's variables for it, checked against every row). On the stage grid this is not the plan's
canonical schedule (the grid differentiates in reverse topological order, the plan block by block),
so it is priced again: its overhead, program peak and simulated peak are its own
(``info["warm_start"]``). When it fits the budget it is a candidate and HiGHS starts from it (at a
program budget raised to its program peak where the program overprices it): the plan is then never
worse than the warm start and HiGHS always has a schedule. ``scipy.optimize.milp`` takes no initial
solution, so the model goes to scipy's vendored HiGHS bindings directly (:func:`_highs`; cold
through ``scipy.optimize.milp`` where they are missing).

Bound. ``info["bound"]`` is HiGHS's lower bound on the overhead of any schedule of the (coarse)
program whose program peak fits the program budget of the plan (``info["milp_budget"]``; a bound
found at a larger program budget holds there too). The program over-prices a schedule only by the
amounts above, so on the graph itself (no coarsening) and at a program budget equal to the budget it
bounds, up to those few bytes, every schedule of the stage grid whose simulated peak fits; on a
coarsened graph or at a raised program budget it bounds only the schedules the program admits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from recompute.core.graph import Graph
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import InfeasibleBudget, Plan, register
from recompute.pricing.schedule import Schedule, Writer
from recompute.pricing.simulate import simulate
from recompute.planners.milp.pricing import keep, problem, stage_memory
from recompute.planners.milp.problem import Problem
from recompute.planners.milp.solve import NoSolution, Solution, _solve

__all__ = ["milp", "lp_bound", "on_demand"]


def on_demand(pb: Problem, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, S) of the schedule that keeps ``kept`` (coarse nodes) from the forward pass and, in each
    backward stage, computes what its backward ops read and is not there (and the missing inputs of
    that), keeping every value exactly while a later stage reads it (:func:`keep`). With ``kept`` a
    canonical strategy's cache (∪ ∂(L_i) and the last block), it recomputes no more than the strategy
    does."""
    n, T = pb.n, 2 * pb.n
    R = np.zeros((T, n), dtype=bool)
    R[np.arange(n), np.arange(n)] = True
    there = kept | pb.pinned
    for t in range(n, T):
        want = (pb.needs[t - n] | pb.needs_saved[t - n]) & ~there
        for v in range(n - 1, -1, -1):  # inputs have smaller indices: one sweep closes the set
            if want[v]:
                ps = list(pb.preds[v])
                want[ps] |= ~there[ps]
        R[t] = want
        there = there | want
    return R, keep(pb, R)


def _kept(pb: Problem, plan: Plan) -> tuple[list[np.ndarray], int]:
    """Coarse kept sets for a lower-set ``plan``: its cache U_k and last block (what its canonical
    schedule keeps from the forward pass), a coarse node kept when all its nodes are and, where some
    coarse node mixes kept and dropped nodes, also when any is; and the number of such nodes."""
    nodes = plan.cached | plan.blocks[-1]
    share = np.array([sum(v in nodes for v in grp) / len(grp) for grp in pb.groups])
    mixed = int(((share > 0) & (share < 1)).sum())
    return ([share == 1, share > 0] if mixed else [share == 1]), mixed


def _schedule(g: Graph, pb: Problem, R: np.ndarray) -> Schedule:
    """The executable schedule of R: stage by stage, the nodes it computes (in order; a node computed
    again is a new copy), then in a backward stage its backward ops."""
    p = g.program
    out = Writer()
    for node in p.prologue:
        out.emit(node, 0, False)
    backward_start = 0
    for t in range(2 * pb.n):
        if t == pb.n:
            backward_start = len(out.steps)
        for c in np.flatnonzero(R[t]):
            for v in pb.groups[c]:
                for node in p.members[v]:
                    out.emit(node, t + 1, True)
        if t >= pb.n:
            for name in pb.stage_ops[t - pb.n]:
                out.emit(p.joint.node(name), t + 1, False)
    return out.schedule(backward_start)


@register("milp", emits_schedule=True)
def milp(g: Graph, *, budget: int | None = None, time_limit: float = 60.0,
         max_nodes: int = 60, mip_rel_gap: float = 1e-4, retries: int = 4,
         warm_start: Sequence[Plan] | None = None) -> Plan:  # fmt: skip
    """The least recomputation (Σ T_v R[t, v]) whose peak fits ``budget``, over every schedule of the stages
    (see the module docstring); ``budget=None``: the smallest peak, then the least overhead at it.

    ``time_limit`` bounds each HiGHS solve (seconds); the plan keeps HiGHS's status, its bound and
    gap in ``info``. Graphs of more than ``max_nodes`` nodes are coarsened. On a traced graph the
    plan carries its :class:`~recompute.pricing.schedule.Schedule` and ``peak`` is its simulated peak;
    ``retries`` bounds the re-solves with the program's budget moved by the simulated excess or slack.
    ``warm_start``: lower-set plans HiGHS starts from (their cache kept, :func:`on_demand`), by
    default approxdp-TC's at ``budget``; ``()`` for a cold start.
    """
    pb = problem(g, max_nodes)
    total = g.total_time()
    info: dict[str, Any] = {"coarsened_from": g.n, "coarsened_to": pb.n, "time_limit": time_limit}
    known, info["warm_start"] = _warm(g, pb, budget, total, warm_start)
    fitting = [c for c in known if budget is not None and c.peak <= budget]  # no budget: the least peak first
    best = min(fitting, key=lambda c: c.overhead, default=None)
    info["warm_overhead"] = best.overhead if best is not None else None
    solves: list[Solution] = []
    bounds: list[tuple[int, float]] = []  # (program budget, HiGHS's bound on Σ T R there)

    def start(limit: int | None) -> tuple[np.ndarray, np.ndarray] | None:
        """The least-overhead schedule known whose program peak fits ``limit`` (None: the least peak)."""
        ok = [c for c in known if limit is None or c.model_peak <= limit]
        pick = min(ok, key=(lambda c: c.model_peak) if limit is None else (lambda c: c.overhead), default=None)
        return (pick.solution.R, pick.solution.S) if pick is not None else None

    model_budget = budget
    fits = overshoots = None  # program budgets whose plan fits / exceeds the budget, when simulated
    if budget is None:  # the least peak, then (if HiGHS finds one in time) the least overhead at it
        solves.append(_solve(pb, None, time_limit, mip_rel_gap, start=start(None)))
        info["peak_bound"] = int(solves[0].bound)
        model_budget = int(stage_memory(pb, solves[0].R, keep(pb, solves[0].R)).max())
        known.append(_Candidate.price(g, pb, solves[0], model_budget, total))  # the start at that peak
    elif best is not None and best.model_peak > budget:  # the program overprices the warm start: let it in
        model_budget = best.model_peak
    for attempt in range(retries + 1):
        try:
            sol = _solve(pb, model_budget, time_limit, mip_rel_gap, start=start(model_budget))
            bounds.append((model_budget, sol.bound))
        except (NoSolution, InfeasibleBudget):
            if best is not None:
                break
            if budget is None and solves:
                sol = solves[0]
            elif g.program is not None and attempt == 0:  # the model overprices: try its least peak
                sol = _solve(pb, None, time_limit, mip_rel_gap, start=start(None))
                model_budget = int(stage_memory(pb, sol.R, keep(pb, sol.R)).max())
            else:
                raise
        if not any(x is sol for x in solves):
            solves.append(sol)
        got = _Candidate.price(g, pb, sol, model_budget, total)
        known.append(got)
        if budget is None or got.peak <= budget:
            best = got if best is None or got.overhead <= best.overhead else best  # ties: the solve, with its status
        if budget is None or g.program is None or got.overhead == 0 or got.peak == budget:
            break
        # the model is not the simulator: move the program's budget by the slack or the excess
        if got.peak <= budget:
            fits = model_budget
        else:
            overshoots = model_budget
        if fits is not None and overshoots is not None:
            if overshoots - fits <= max(1, budget // 1000):
                break
            model_budget = (fits + overshoots) // 2
        elif fits is None:
            model_budget = min(model_budget - (got.peak - budget), int(model_budget * 0.99))
        else:
            model_budget += budget - got.peak
    if best is None:
        raise InfeasibleBudget("milp", budget, None)
    sol = best.solution
    # the optimum falls as the program's budget rises: a bound at a larger budget holds at the plan's
    valid = [b for mb, b in bounds if mb is not None and mb >= best.model_budget]
    bound = 0.0 if sol.least_peak or not valid else max(0.0, max(valid) - total)
    info.update(
        status=sol.status, objective=best.overhead, bound=bound,
        gap=(best.overhead - bound) / best.overhead if best.overhead else 0.0, mip_gap=sol.mip_gap,
        highs_seconds=sum(x.seconds for x in solves), solves=len(solves),
        milp_budget=best.model_budget, variables=solves[-1].variables if solves else 0,
        rows=solves[-1].rows if solves else 0, R=sol.R, S=sol.S, model=MemoryModel.milp,
    )
    cached = frozenset(v for c in np.flatnonzero(sol.S[pb.n, :pb.n] | sol.S[pb.n, pb.n:]) for v in pb.groups[c])
    model = MemoryModel.milp if g.program is None else MemoryModel.simulator
    return Plan(method="milp", strategy=None, lower_sets=[g.nodes], cached=cached, overhead=best.overhead,
                peak=best.peak, budget=budget, model_peak=best.model_peak, info=info, memory_model=model,
                schedule=best.schedule)


def _warm(g: Graph, pb: Problem, budget: int | None, total: int,
          plans: Sequence[Plan] | None) -> tuple[list["_Candidate"], str]:  # fmt: skip
    """The warm starts of ``plans`` (default: approxdp-TC's at ``budget``) on the stage grid, priced,
    and what became of them (said in ``info["warm_start"]``)."""
    if plans is None:
        from recompute.planners.registry import plan as make_plan

        try:
            plans = [make_plan(g, "approxdp", strategy="tc", budget=budget)]
        except InfeasibleBudget:
            return [], "none: approxdp-TC has no plan at this budget"
    out: list[_Candidate] = []
    notes: list[str] = []
    for p in plans:
        if p.schedule is not None:
            notes.append(f"{p.method}: no lower-set plan, not used")
            continue
        masks, mixed = _kept(pb, p)
        for kept in masks:
            R, S = on_demand(pb, kept)
            warm = Solution(status="warm_start", R=R, S=S, objective=float((pb.time * R).sum()), bound=np.nan,
                            mip_gap=np.nan, seconds=0.0, variables=0, rows=0, least_peak=budget is None, warm=True)
            c = _Candidate.price(g, pb, warm, None, total)
            c.model_budget = c.model_peak
            out.append(c)
        label = f"{p.method}-{p.strategy.upper() if p.strategy else ''}"
        notes.append(f"{label} (overhead {p.overhead}, peak {p.peak}) → {len(masks)} schedule(s)"
                     + (f", {mixed} coarse nodes mix kept and recomputed values" if mixed else "")
                     + ": " + ", ".join(f"overhead {c.overhead}, peak {c.peak}" for c in out[-len(masks):]))
    return out, "; ".join(notes) or "none"


@dataclass
class _Candidate:
    """A solution priced: its overhead, its model peak, and on a traced graph its schedule's simulated peak."""

    solution: Solution
    model_budget: int | None
    overhead: int
    model_peak: int
    peak: int
    schedule: Schedule | None

    @classmethod
    def price(cls, g: Graph, pb: Problem, sol: Solution, model_budget: int | None, total: int) -> "_Candidate":
        """Its schedule priced by the program at the least S that runs it (:func:`keep`) and simulated."""
        sol = replace(sol, S=keep(pb, sol.R))
        model_peak = int(stage_memory(pb, sol.R, sol.S).max())
        sched = _schedule(g, pb, sol.R) if g.program is not None else None
        peak = simulate(g.program, sched).peak if sched is not None else model_peak
        return cls(sol, model_budget, int((pb.time[None, :] * sol.R).sum()) - total, model_peak, peak, sched)


def lp_bound(g: Graph, budget: int, *, max_nodes: int | None = None, time_limit: float = 60.0) -> float:
    """The LP relaxation's optimum: a lower bound on the overhead of every schedule of the program
    for ``g`` (coarsened to ``max_nodes``; ``None``: the graph itself) whose model peak fits ``budget``."""
    sol = _solve(problem(g, max_nodes), budget, time_limit, 0.0, relax=True)
    return max(0.0, sol.objective - g.total_time())

