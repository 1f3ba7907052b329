"""The modelled time of a schedule: what a plan's step costs besides its memory.

Where the graph was priced by the ``measured`` cost model, its program keeps the time model that timed
its ops (``Program.time_model``): a schedule's time is then the sum of its op calls' seconds, every
call as it runs (a recomputation is a forward op's call again; an op run in place its in-place
variant; a split convolution backward its two ops), in nanoseconds, the unit of T_v under that model.
Under any other cost model only the forward costs T_v are known, and the step is priced in their
units by the usual rule that a node's backward costs twice its forward (Chen et al. 2016; Griewank &
Walther): 3·Σ_v T_v for the plain step, plus Σ T_v over what the schedule recomputes
(:func:`~recompute.pricing.schedule.recomputation_cost`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recompute.pricing.schedule import Schedule, canonical, recomputation_cost
from recompute.capture.timing import schedule_calls

if TYPE_CHECKING:
    from recompute.core.graph import Graph

__all__ = ["step_time", "plain_time"]

BACKWARD_TO_FORWARD = 2  # a node's backward costs this × its forward where only T_v is known


def step_time(g: "Graph", s: Schedule) -> float:
    """The modelled time of running ``s``, in the units of ``g.time`` (see the module docstring)."""
    p = g.program
    if p is None:
        raise ValueError("a step's time is priced on a traced graph (recompute.trace)")
    if p.time_model is not None:
        return p.time_model.seconds(schedule_calls(p, s)) * 1e9
    return float((1 + BACKWARD_TO_FORWARD) * int(g.time.sum()) + recomputation_cost(g, s))


def plain_time(g: "Graph") -> float:
    """The modelled time of the plain step: every op once, nothing recomputed (vanilla's schedule)."""
    return step_time(g, canonical(g, [g.nodes]))
