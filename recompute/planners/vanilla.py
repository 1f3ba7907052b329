"""``vanilla``: no recomputation, a single block with everything kept (the baseline peak)."""

from __future__ import annotations

from recompute.core.graph import Graph
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import Plan, register


@register("vanilla")
def vanilla(g: Graph, *, budget: int | None = None, memory_model: str = MemoryModel.paper.value) -> Plan:
    """k = 1, L_1 = V: the backward pass finds every forward value alive (peak under ``memory_model``)."""
    return Plan.from_sequence(g, [g.nodes], method="vanilla", budget=budget, memory_model=memory_model)
