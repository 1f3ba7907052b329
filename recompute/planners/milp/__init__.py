"""``milp``: optimal rematerialization as a mixed-integer program (Checkmate, Jain et al., MLSys 2020).

Stages. The nodes of V are numbered 0 … n-1 in topological order (``graph.topo_order``, the traced
order on a traced graph). Stage t < n is forward stage t: it computes node t. Stage n + s is the
backward stage of node n-1-s (nodes are differentiated from last to first): it may recompute any
node, then runs the backward ops of its node. There are T = 2n stages.

The package follows the program's own parts: :mod:`.problem` (the stage grid, the coarse nodes),
:mod:`.pricing` (what each node and backward op costs, from the storage table of
:mod:`recompute.core.storage`, and the price of a schedule), :mod:`.solve` (Checkmate's variables and rows,
HiGHS) and :mod:`.planner` (the registered planner: warm start, re-solves against the simulator).
"""

from recompute.planners.milp.planner import lp_bound, milp, on_demand
from recompute.planners.milp.pricing import keep, problem, stage_memory
from recompute.planners.milp.problem import Problem, coarsen
from recompute.planners.milp.solve import NoSolution, point

__all__ = ["milp", "lp_bound", "Problem", "problem", "coarsen", "stage_memory", "point", "keep", "on_demand",
           "NoSolution"]
