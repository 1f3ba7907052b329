"""``auto``: the plan a user should run, chosen for a goal stated in time or in memory.

The paper's planners answer "the least recomputation under a budget" (time-centric) or "the smallest
budget" (memory-centric) over lower sets, and the schedule rewrites (:func:`~recompute.rewrites.pipeline.with_rewrites`)
lower what a plan's step holds further. A user asks something else: *how little memory can my step
take if it may run ``max_time`` × as long as plain training* (default 1.3), or *how fast can it run in
``budget`` bytes*. ``auto`` answers it by search, every candidate priced by the simulator (its peak,
:mod:`recompute.pricing.simulate`) and the time model (its step's time, :mod:`recompute.pricing.steptime`):

1. bases: vanilla, the approximate DP's time-centric plan at its smallest budget and at
   ``budgets`` budgets between that and vanilla's peak, its memory-centric plan at its smallest;
2. each base with the rewrites that cost no more than a pass over cheap ops: cheap values recomputed
   late where the peak needs it (:func:`~recompute.rewrites.pipeline.with_late_recompute`), then eager memory habits
   (:func:`~recompute.rewrites.pipeline.with_in_place`) — kept only where they lower the peak, bitwise the same step;
3. time goal: where the smallest plans take longer than allowed, the time-centric DP's budget is
   bisected for the smallest peak within the allowance; then the lowest-peak bases within it get
   recomputation at the peak (:func:`~recompute.rewrites.pipeline.with_peak_recompute`), spending at most what is left of
   the allowance; the least peak wins (then the least time);
   memory goal: the least time among the candidates that fit, the time-centric DP's budget bisected for
   the loosest that fits after the rewrites, recomputation at the peak until the peak fits where none
   does.

Every step the search emits is one of the rewrites' and trains bitwise like plain training. Plans
carry their modelled time as ``time_ratio`` (÷ the plain step's). The door
:func:`recompute.optimize` also tries split convolution backwards where the chosen peak needs them.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from recompute.capture.convsplit import SPLIT_FROM
from recompute.core.graph import Graph
from recompute.rewrites.inplace import simulated_in_place
from recompute.rewrites.peak import needed_splits
from recompute.planners.registry import InfeasibleBudget, Plan, plan, register
from recompute.pricing.simulate import simulate
from recompute.pricing.steptime import plain_time, step_time
from recompute.capture.timing import TensorSpec
from recompute.capture.workspace import runs_on
from recompute.rewrites.pipeline import with_in_place, with_late_recompute, with_peak_recompute

__all__ = ["auto", "choose", "Candidate", "MAX_TIME"]

MAX_TIME = 1.3  # the default time allowance: × plain training's step


@dataclass(frozen=True)
class Candidate:
    """A plan the search priced: the planner's plan it started from (``base``, named ``source``), the
    rewrites applied to it, the result, its peak (bytes) and its step's modelled time (units of T_v)."""

    source: str
    base: Plan
    rewrites: tuple[str, ...]
    plan: Plan
    time: float

    @property
    def peak(self) -> int:
        return self.plan.peak

    @property
    def label(self) -> str:
        return "+".join((self.source, *self.rewrites))


def _in_place(g: Graph, source: str, base: Plan) -> Candidate:
    """A base run in place: one simulation, what every base is screened by."""
    p = with_in_place(base, g)
    return Candidate(source, base, ("in-place",), p, step_time(g, p.runs(g)))


def _rewritten(g: Graph, c: Candidate, allowance: float, target: int = 0) -> Candidate:
    """``c``'s base with cheap values recomputed late where the peak needs it, then recomputation at
    the peak spending at most what is left of ``allowance`` (T_v units) and stopping once the peak is
    ``target`` or less, run in place; each kept only where it lowers the peak (``c`` where none does)."""
    late = with_late_recompute(c.base, g, then_in_place=True)
    rewrites = ("late",) if late is not c.base else ()
    placed = with_in_place(late, g)
    time = step_time(g, placed.runs(g))
    if placed.peak > c.peak or time > allowance:
        late, rewrites, placed, time = c.base, (), c.plan, c.time
    # the rewrite spends in forward T_v of the ops it recomputes; the step's modelled time (views, masks and
    # in-place variants too) is what the allowance bounds: where it runs over, the rewrite gets half as much
    limit = allowance - time
    for _ in range(PEAK_TRIES):
        at_peak = with_in_place(with_peak_recompute(late, g, limit=limit, then_in_place=True, target=target), g)
        if at_peak.peak >= placed.peak:
            break
        if (spent := step_time(g, at_peak.runs(g))) <= allowance:
            rewrites, placed, time = (*rewrites, "peak"), at_peak, spent
            break
        limit /= 2
    return Candidate(c.source, c.base, (*rewrites, "in-place"), placed, time)


def _tc(g: Graph, budget: int | None) -> Plan:
    return plan(g, "approxdp", strategy="tc", budget=budget)


def _bisect(g: Graph, lo: int, hi: int, fits: Callable[[Candidate], bool], probes: int = 8) -> list[Candidate]:
    """Time-centric plans (run in place) at planner budgets between ``lo`` and ``hi`` (bytes), halving
    toward where ``fits`` changes: false at ``lo``, true at ``hi``."""
    found = []
    for _ in range(probes):
        if hi - lo <= max(1, lo // 200):
            break
        mid = (lo + hi) // 2
        try:
            c = _in_place(g, f"approxdp tc budget {mid}", _tc(g, mid))
        except InfeasibleBudget:
            lo = mid
            continue
        found.append(c)
        lo, hi = (lo, mid) if fits(c) else (mid, hi)
    return found


SHORTLIST = 2  # screened candidates that get the costlier rewrites
PEAK_TRIES = 4  # recomputation at the peak tried with its limit halved this many times at most


@register("auto", emits_schedule=True)
def auto(g: Graph, *, budget: int | None = None, max_time: float = MAX_TIME, budgets: int = 4) -> Plan:
    """The least peak whose step's modelled time is at most ``max_time`` × plain training's, or, with
    a ``budget`` (bytes), the least time whose peak fits it (see the module docstring). ``budgets``:
    the time-centric DP's budgets tried between its smallest and vanilla's peak. Raises
    :class:`~recompute.planners.registry.InfeasibleBudget` naming the smallest peak found where none fits."""
    if g.program is None:
        raise ValueError("auto prices schedules of the joint graph: plan a traced graph (recompute.trace)")
    if not (math.isfinite(max_time) and max_time > 0):  # the registry has checked the types
        raise ValueError(f"max_time must be a finite number > 0 (× plain training's step time), got {max_time!r}")
    if budgets < 0:
        raise ValueError(f"budgets must be a whole number ≥ 0 (time-centric budgets searched), got {budgets!r}")
    plain = plain_time(g)
    vanilla = plan(g, "vanilla")
    tc, mc = _tc(g, None), plan(g, "approxdp", strategy="mc")
    bases = [("vanilla", vanilla), ("approxdp tc", tc), ("approxdp mc", mc)]
    for j in range(1, budgets + 1):
        b = tc.peak + (vanilla.peak - tc.peak) * j // (budgets + 1)
        # near the smallest, a budget may be below what the planner's own search reaches: skipped
        with contextlib.suppress(InfeasibleBudget):
            bases.append((f"approxdp tc budget {b}", _tc(g, b)))
    found = [_in_place(g, source, p) for source, p in bases]
    if budget is None:
        allowance = max_time * plain
        if min(c.peak for c in found) < min(c.peak for c in found if c.time <= allowance):
            # the smallest plans are too slow: the smallest time-centric one within the allowance
            found += _bisect(g, tc.peak, vanilla.peak, lambda c: c.time <= allowance)
        fast = sorted((c for c in found if c.time <= allowance), key=lambda c: (c.peak, c.time))
        if not fast:
            raise ValueError(f"no step runs within max_time={max_time} × plain training's time: the fastest "
                             f"takes {min(c.time for c in found) / plain:.3f}×")
        fast += [_rewritten(g, c, allowance) for c in fast[:SHORTLIST]]
        best = min(fast, key=lambda c: (c.peak, c.time))
    else:
        if any(c.peak <= budget for c in found):  # the loosest time-centric plan that fits: the least time
            found += _bisect(g, min(c.base.peak for c in found if c.peak <= budget), vanilla.peak,
                             lambda c: c.peak > budget)
        # the fastest that do not fit, and the smallest, with recomputation at the peak until they do
        over = sorted((c for c in found if c.peak > budget), key=lambda c: c.time)
        for c in {id(c): c for c in [*over[:SHORTLIST], *sorted(over, key=lambda c: c.peak)[:1]]}.values():
            found.append(_rewritten(g, c, math.inf, target=budget))
        fit = [c for c in found if c.peak <= budget]
        if not fit:
            raise InfeasibleBudget("auto", budget, min(c.peak for c in found))
        best = min(fit, key=lambda c: (c.time, c.peak))
    return replace(best.plan, method="auto", strategy=None, budget=budget, time_ratio=best.time / plain,
                   info={**best.plan.info, "chosen": best.label, "candidates": len(found)})


def choose(trace_at: Callable[[bool | frozenset[str]], Graph], *, budget: int | None = None,
           split_convolutions: bool | None = None, **options: object) -> tuple[Graph, Plan]:
    """The graph and plan :func:`auto` chooses for a model, with convolution backwards split where the
    chosen step's peak needs it (``split_convolutions=None``; ``True``/``False``: every one, none).
    ``trace_at(split)`` traces the model's step with those splits (``recompute.trace(...,
    split_convolutions=split)``). The step traced with every split is planned; the splits its peak
    needs (:func:`recompute.rewrites.peak.needed_splits`) whose two ops give the fused op's values bitwise
    on random tensors of their traced shapes are kept, the step traced again with those alone and
    planned, and that plan is taken where its peak is lower. The time allowance stays ``max_time``
    × the plain step's without splits."""
    g = trace_at(bool(split_convolutions))
    p = plan(g, "auto", budget=budget, **options)
    if split_convolutions is not None or not _peaks_at_a_convolution_backward(g, p):
        return g, p
    plain = plain_time(g)
    every = trace_at(True)
    scaled = {**options, "max_time": float(options.get("max_time", MAX_TIME)) * plain / plain_time(every)}  # type: ignore[arg-type]
    try:
        trial = plan(every, "auto", budget=budget, **scaled)
    except (InfeasibleBudget, ValueError):
        return g, p
    needed = needed_splits(every.program, trial.runs(every), simulated_in_place(every.program))
    exact = frozenset(name for name in needed if _split_is_exact(every, name))
    if not exact:
        return g, p
    some = trace_at(exact)
    try:
        q = plan(some, "auto", budget=budget, **{**options, "max_time": scaled["max_time"] * plain_time(every) / plain_time(some)})
    except (InfeasibleBudget, ValueError):
        return g, p
    if (q.peak, q.time_ratio) >= (p.peak, p.time_ratio):
        return g, p
    return some, replace(q, time_ratio=q.time_ratio * plain_time(some) / plain,
                         info={**q.info, "split convolutions": sorted(exact)})


def _peaks_at_a_convolution_backward(g: Graph, p: Plan) -> bool:
    """Whether the step of ``p`` peaks at a convolution backward that makes its input's gradient and
    its weight's: the op a split runs as two, so that the peak there may fall (tracing the step again
    with splits costs seconds; elsewhere they would not lower the peak)."""
    s = p.runs(g)
    node = g.program.joint.node(s.steps[simulate(g.program, s).peak_step][0])
    return node.target is torch.ops.aten.convolution_backward.default and bool(node.args[-1][0] and node.args[-1][1])


def _split_is_exact(g: Graph, name: str) -> bool:
    """Whether the split of convolution backward ``name`` in ``g``'s joint graph gives the fused op's
    input gradient bitwise, on random tensors of its traced shapes on its device."""
    joint = g.program.joint
    fused = joint.node(name)
    grad_input = next(n for n in joint.gm.graph.nodes if n.meta.get(SPLIT_FROM) == name)
    device = runs_on(joint.gm) or torch.device("cpu")
    made: dict[str, torch.Tensor] = {}

    def real(x: fx.Node) -> torch.Tensor:  # one random tensor per input both ops read
        if x.name not in made:
            made[x.name] = TensorSpec.of(x.meta["val"]).make(device)
        return made[x.name]

    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        *rest, mask = fx.node.map_arg(fused.args, real)
        want = fused.target(*rest, [True, *mask[1:]])[0]
        got = grad_input.target(*fx.node.map_arg(grad_input.args, real))
    return bool(torch.equal(want, got))
