"""Recomputing more than once: schedules of chains and join graphs in the papers' pebble game.

* :mod:`.schedule` — the record (:class:`Schedule` of :class:`Op`), per-step :class:`Profile`, :func:`simulate`.
* :mod:`.chain` — Opt0 (:func:`opt0_table`, :func:`segment_ops`) and Chen's :func:`chen_recursive`.
* :mod:`.join` — Beaumont et al.'s :func:`join_dp`, :func:`c_min`, :func:`revolve`, :func:`equiv_chain`.
* :mod:`.graphmap` — a traced :class:`~recompute.core.graph.Graph` as a chain or a join of sub-graph steps.
"""

from recompute.planners.pebble.chain import chen_recursive, opt0_table, segment_ops
from recompute.planners.pebble.graphmap import JoinMap, Step, chain_of, join_of
from recompute.planners.pebble.join import c_min, c_opt, equiv_chain, join_dp, join_table, makespans, revolve
from recompute.planners.pebble.schedule import (BranchProfile, Costs, InvalidSchedule, Op, OpKind, Profile, Schedule, Simulation, Value,
                       simulate)

__all__ = [
    "Op", "OpKind", "Value", "Schedule", "Costs", "BranchProfile", "Profile", "Simulation", "InvalidSchedule",
    "simulate", "opt0_table", "segment_ops", "chen_recursive", "c_min", "c_opt", "join_table", "makespans",
    "join_dp", "revolve", "equiv_chain", "JoinMap", "Step", "chain_of", "join_of",
]
