"""recompute: plan and execute recomputation (activation checkpointing) over lower sets of the graph.

    import recompute
    g = recompute.trace(model, (x,))             # G = (V, E) with M_v, T_v
    p = recompute.plan(g, "approxdp", strategy="tc")
    fast = recompute.optimize(model, (x,))       # a module that trains with less memory
"""

from . import lowerset
from .graph import Graph
from .plan import InfeasibleBudget, Plan, plan, planners

__all__ = ["Graph", "Plan", "InfeasibleBudget", "plan", "planners", "lowerset"]
