"""``revolve``, ``chen_recursive`` and ``join_dp``: plans that recompute a value more than once.

A canonical strategy (Kusumoto et al. 2019) recomputes each value at most once. These planners see the
traced graph as a chain of steps (:func:`~recompute.planners.pebble.chain_of`: the links between its
articulation points) or as a join (:func:`~recompute.planners.pebble.join_of`: one branch per input up
to the head), schedule it in the pebble game of Beaumont et al. (2020) with c slots — Revolve's Opt0
(Griewank & Walther 2000), Chen et al.'s (2016, §4.4) recursion, Beaumont's join DP — and compile the
pebble schedule onto the joint graph (:func:`~recompute.planners.pebble.compile.to_schedule`). The plan
carries that :class:`~recompute.pricing.schedule.Schedule` and its ``peak`` is the simulator's exact peak.

A slot holds one value whatever its size, so the slot count is searched against the simulator: every
c from c_min (Theorem 3.3) to C_opt = Σ(ℓ_b + 1) is compiled and priced. With ``budget=None`` the plan
is the one of smallest simulated peak; with a budget (bytes), the one with the fewest recomputed op
instances whose simulated peak fits it, and :class:`~recompute.planners.registry.InfeasibleBudget` names the
smallest simulated peak when none does. ``chen_recursive`` has no slot bound to search: its budget is
only checked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from recompute.core.graph import Graph
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.pebble import c_min, c_opt, chain_of, join_of
from recompute.planners.pebble import chen_recursive as chen_recursion
from recompute.planners.pebble import join_dp as join_schedule
from recompute.planners.pebble import revolve as revolve_schedule
from recompute.planners.pebble.compile import to_schedule
from recompute.planners.pebble.graphmap import JoinMap
from recompute.planners.pebble.schedule import Schedule as PebbleSchedule
from recompute.planners.registry import InfeasibleBudget, Plan, register
from recompute.pricing.schedule import recomputation_cost
from recompute.pricing.simulate import simulate

__all__ = ["revolve", "chen_recursive", "join_dp"]


def _traced(g: Graph, method: str) -> None:
    if g.program is None:
        raise ValueError(f"{method} compiles a schedule of the joint graph: plan a traced graph (recompute.trace)")


def _priced(g: Graph, jm: JoinMap, pebbles: PebbleSchedule, budget: int | None) -> Plan:
    """The plan running ``pebbles`` on ``g``: compiled, priced by the simulator."""
    schedule = to_schedule(g, jm, pebbles)
    return Plan(
        method=pebbles.method, strategy=None, lower_sets=[g.nodes], cached=frozenset(),
        overhead=recomputation_cost(g, schedule), peak=simulate(g.program, schedule).peak, budget=budget,
        slots=pebbles.slots, info={"lengths": jm.lengths, "recomputations": schedule.recomputations(),
              "makespan": pebbles.makespan, **pebbles.info},
        memory_model=MemoryModel.simulator, schedule=schedule,
    )


def _search(g: Graph, jm: JoinMap, schedule_for: Callable[[int], PebbleSchedule], slots: range,
            budget: int | None) -> Plan:  # fmt: skip
    """Over slot counts ``slots``: the smallest simulated peak, or the fewest recomputations within
    ``budget`` (ties: the smaller peak)."""
    best: Plan | None = None
    best_key: tuple[int, int] | None = None
    smallest: int | None = None
    for c in slots:
        p = _priced(g, jm, schedule_for(c), budget)
        smallest = p.peak if smallest is None else min(smallest, p.peak)
        key = (p.peak, p.info["recomputations"]) if budget is None else (p.info["recomputations"], p.peak)
        if (budget is None or p.peak <= budget) and (best_key is None or key < best_key):
            best, best_key = p, key
    if best is None:
        raise InfeasibleBudget(schedule_for(slots.start).method, budget, smallest)
    return replace(best, info={**best.info, "slots_searched": (slots.start, slots.stop - 1)})


def _slot_range(lengths: tuple[int, ...], slots: int | None) -> range:
    return range(slots, slots + 1) if slots is not None else range(c_min(lengths), c_opt(lengths) + 1)


@register("revolve", emits_schedule=True)
def revolve(g: Graph, *, budget: int | None = None, slots: int | None = None) -> Plan:
    """Revolve (Opt0 of Griewank & Walther) on the chain of ``g``'s articulation steps, uniform step
    costs. ``slots`` fixes c; by default every c from 3 to ℓ + 1 is priced (see the module docstring):
    ``budget=None`` gives the smallest simulated peak."""
    _traced(g, "revolve")
    jm = chain_of(g)
    return _search(g, jm, lambda c: revolve_schedule(jm.lengths[0], c), _slot_range(jm.lengths, slots), budget)


@register("join_dp", emits_schedule=True)
def join_dp(g: Graph, *, budget: int | None = None, slots: int | None = None) -> Plan:
    """Beaumont et al.'s optimal join DP (Theorem 3.4) on ``g`` as a join of one branch per input,
    uniform step costs. ``slots`` fixes c; by default every c from c_min to C_opt is priced (see the
    module docstring): ``budget=None`` gives the smallest simulated peak."""
    _traced(g, "join_dp")
    jm = join_of(g)
    top = c_opt(jm.lengths)
    return _search(g, jm, lambda c: join_schedule(jm.lengths, c, table_slots=top), _slot_range(jm.lengths, slots),
                   budget)


@register("chen_recursive", emits_schedule=True)
def chen_recursive(g: Graph, *, budget: int | None = None, k: int = 1) -> Plan:
    """Chen et al.'s recursion (§4.4, g(n) = k·log_{k+1} n) on the chain of ``g``'s articulation
    steps, storing ``k`` values per level. ``budget`` is only checked against the simulated peak."""
    _traced(g, "chen_recursive")
    jm = chain_of(g)
    p = _priced(g, jm, chen_recursion(jm.lengths[0], k), budget)
    if budget is not None and p.peak > budget:
        raise InfeasibleBudget("chen_recursive", budget, p.peak)
    return p
