"""The schedule rewrites of a plan, composed in one order from one record.

A planner's plan runs its canonical schedule (:mod:`recompute.pricing.schedule`) or its own. Each
rewrite here returns the plan with that schedule rewritten, its ``peak`` the simulated peak of the new
schedule and its ``overhead`` the added recomputation; each keeps the step bitwise the same:

* :func:`with_late_recompute` — cheap values the backward reads early and again much later computed
  once more before the later read (:func:`recompute.rewrites.remat.late_where_needed`);
* :func:`with_peak_recompute` — recomputations run right before their readers and values held across
  the peak computed again after it (:func:`recompute.rewrites.peak.recompute_at_peak`);
* :func:`with_in_place` — eager PyTorch's memory habits: values freed at their last use, pointwise ops
  writing into an input that dies there (:func:`recompute.rewrites.inplace.in_place`).

:class:`Rewrites` names which to apply, as torch's ``MinCutOptions`` names its partitioner's: every
door reads one (:func:`recompute.optimize`'s flags, the app's ``method.*``, ``recompute.backend``,
which adds the partition's own: cheap remat and split convolution backwards).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace

from recompute.capture.validate import check_limit
from recompute.core.graph import Graph
from recompute.planners.registry import Plan
from recompute.pricing.schedule import Schedule, recomputation_cost
from recompute.pricing.simulate import simulate
from recompute.rewrites import peak
from recompute.rewrites.inplace import in_place, simulated_in_place
from recompute.rewrites.remat import late_where_needed

__all__ = ["Rewrites", "with_late_recompute", "with_peak_recompute", "with_in_place", "with_rewrites"]


@dataclass(frozen=True)
class Rewrites:
    """Which rewrites a door applies (all off by default).

    Attributes:
        recompute_late, recompute_at_peak, in_place: the schedule's (:func:`with_rewrites`).
        split_convolutions: each convolution backward run as two ops, the weight's gradient first
            (the trace's: ``recompute.trace(..., split_convolutions=...)``; a compiled partition's backward
            module).
        remat: a compiled partition's cheap ops recomputed in the backward where that keeps fewer bytes
            (:func:`recompute.rewrites.remat.rematerialize`, a weight ≥ 0; None: off).
    """

    recompute_late: bool = False
    recompute_at_peak: bool = False
    in_place: bool = False
    split_convolutions: bool = False
    remat: float | None = None

    @property
    def named(self) -> list[str]:
        """The rewrites on, in the order they apply."""
        return [name for name in ("split_convolutions", "recompute_late", "recompute_at_peak", "in_place")
                if getattr(self, name)]

    def apply(self, plan: Plan, graph: Graph) -> Plan:
        """``plan`` with this record's schedule rewrites (:func:`with_rewrites`)."""
        return with_rewrites(plan, graph, recompute_late=self.recompute_late, recompute_at_peak=self.recompute_at_peak,
                             in_place=self.in_place)


def _traced(graph: Graph, what: str) -> None:
    if graph.program is None:
        raise ValueError(f"{what} rewrites the step's schedule: plan a traced graph (recompute.trace)")


def with_late_recompute(plan: Plan, graph: Graph, *, then_in_place: bool = False) -> Plan:
    """``plan`` with each cheap value (a concatenation, a ReLU: :func:`recompute.rewrites.remat.cheap`)
    that its backward recomputes and reads early and again much later computed once more right before
    the later read instead of held in between, where the simulated peak needs it
    (:func:`recompute.rewrites.remat.late_where_needed`); ``plan`` itself where that lowers no peak. Its
    ``overhead`` adds T_v for each copy of a node it adds (:func:`~recompute.pricing.schedule.recomputation_cost`).
    What a traced DenseNet block holds while its recomputed layers wait for their backward.
    ``then_in_place``: the peaks judged are those of the schedule run in place, for a plan
    :func:`with_in_place` is applied to next."""
    _traced(graph, "recomputing late")
    runs = plan.runs(graph)
    later = _late(plan, graph, then_in_place)
    if later is runs:
        return plan
    added = recomputation_cost(graph, later) - recomputation_cost(graph, runs)
    return replace(plan, schedule=later, peak=simulate(graph.program, later).peak, overhead=plan.overhead + added,
                   info={**plan.info, "late recomputations": len(later) - len(runs)})


# plan → (graph, {judged in place: the search's schedule}): a caller that lists both variants (``+late``,
# ``+late+in-place``) or prices a plan before listing it asks again, and each search takes hundreds of
# simulations on a DenseNet
_LATE: "weakref.WeakKeyDictionary[Plan, tuple[Graph, dict[bool, Schedule]]]" = weakref.WeakKeyDictionary()


def _late(plan: Plan, graph: Graph, then_in_place: bool) -> Schedule:
    """:func:`~recompute.rewrites.remat.late_where_needed` of the schedule that runs, each search once per
    plan and graph: judged in place it starts from the search judged as planned."""
    cached = _LATE.get(plan)
    if cached is None or cached[0] is not graph:
        cached = _LATE[plan] = (graph, {})
    found = cached[1]
    if then_in_place not in found:
        as_planned = _late(plan, graph, False) if then_in_place else None
        found[then_in_place] = late_where_needed(graph.program, plan.runs(graph), written_in_place=then_in_place,
                                                 as_planned=as_planned)
    return found[then_in_place]


def with_in_place(plan: Plan, graph: Graph) -> Plan:
    """``plan`` run with eager PyTorch's memory habits (:func:`recompute.rewrites.inplace.in_place`): each
    value freed at its last use (the canonical schedule holds cached values to their block's end, the
    structure the DPs price), and each pointwise op whose input dies at it writing its output into that
    input's storage, as in-place ReLUs and gradient accumulation do. The same values, bitwise; ``peak``
    is the simulated peak of that schedule. Apply it last: rewriting the schedule again drops it."""
    _traced(graph, "running ops in place")
    written = in_place(graph.program, plan.runs(graph))
    return replace(plan, schedule=written, peak=simulate(graph.program, written).peak,
                   info={**plan.info, "in place": len(written.into)})


def with_peak_recompute(plan: Plan, graph: Graph, *, limit: float = math.inf, then_in_place: bool = False,
                        target: int = 0) -> Plan:
    """``plan`` with each recomputation run right before its first reader and the values it holds across
    its peak computed again after it, while the simulated peak falls (to ``target`` bytes at the least)
    and the added recomputation stays within ``limit`` (in T_v units;
    :func:`recompute.rewrites.peak.recompute_at_peak`). Values are freed at their last use; a value may
    now be recomputed more than once. ``then_in_place``: the peaks judged are those of the schedule run
    in place, for a plan :func:`with_in_place` is applied to next."""
    check_limit(limit)
    _traced(graph, "recomputing at the peak")
    p, runs = graph.program, plan.runs(graph)
    judge = simulated_in_place(p) if then_in_place else None
    found = peak.recompute_at_peak(graph, runs, limit=limit, simulated=judge, target=target)
    added = recomputation_cost(graph, found) - recomputation_cost(graph, runs)
    return replace(plan, schedule=found, peak=simulate(p, found).peak, overhead=plan.overhead + added,
                   info={**plan.info, "recomputed at the peak": added})


def with_rewrites(plan: Plan, graph: Graph, *, recompute_late: bool = False, recompute_at_peak: bool = False,
                  in_place: bool = False) -> Plan:
    """``plan`` with the schedule rewrites asked for, in the one order they compose: cheap values
    recomputed late (:func:`with_late_recompute`), values held across the peak recomputed after it
    (:func:`with_peak_recompute`), then eager memory habits (:func:`with_in_place`), each judged on the
    step as the rewrites after it leave it."""
    p = with_late_recompute(plan, graph, then_in_place=in_place) if recompute_late else plan
    p = with_peak_recompute(p, graph, then_in_place=in_place) if recompute_at_peak else p
    return with_in_place(p, graph) if in_place else p
