"""recompute: plan and execute recomputation (activation checkpointing) over lower sets of the graph.

    import recompute
    g = recompute.trace(model, (x,))                  # G = (V, E) with M_v (bytes) and T_v
    p = recompute.plan(g, "approxdp", strategy="tc")  # a canonical strategy L_1 ≺ … ≺ L_k = V
    m = recompute.optimize(model, (x,))               # a module that trains with less memory
    r = recompute.measure(model, (x,), runner=recompute.execute(g, p), backend="fake")
    c = torch.compile(model, backend=recompute.backend("approxdp"))  # our plan partitions the joint graph
"""

from recompute import doors, planners  # noqa: F401  (importing the planners and the doors registers them)
from recompute.core import lowerset
from recompute.doors.execute import Executor, execute
from recompute.core.graph import Graph
from recompute.doors.measure import Measurement, measure
from recompute.doors.optimize import RecomputeModule, RetraceWarning, optimize
from recompute.planners.registry import InfeasibleBudget, Plan, methods, plan
from recompute.capture.trace import HookWarning, TraceError, trace

__all__ = [
    "Graph", "Plan", "Executor", "Measurement", "RecomputeModule", "InfeasibleBudget", "TraceError",
    "HookWarning", "RetraceWarning",
    "trace", "plan", "methods", "execute", "optimize", "measure", "backend", "lowerset",
]


def __getattr__(name: str) -> object:
    # ``recompute.backend`` on first use: its module imports TorchDynamo and inductor's partitioner
    # hooks (~3 s), which planning and executing a model do not need
    if name == "backend":
        from recompute.doors.backend import backend

        return backend
    raise AttributeError(f"module 'recompute' has no attribute {name!r}")
