"""The planners' numba kernels (``@numba.njit(cache=True)``: the DPs, the block costs, the join DP).

A kernel is compiled once per install into numba's on-disk cache (``scripts/warm_numba.py``, run by
``scripts/install.sh``: 20–30 s) and loaded once per process: about 0.6–0.8 s for numba's registries and
the cached machine code, the same for any graph. :func:`load` does both for the planners asked: the
app calls it before it times a solve, so that a record's ``solve_seconds`` is the planner's own time on
its graph and the one-off load is reported beside it (``kernel_seconds``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Iterable

from experiments import nets
from recompute.pricing.memory_model import PLANNING
from recompute.planners.registry import STRATEGIES, methods, plan, spec
from recompute.capture.trace import trace

__all__ = ["Loaded", "load"]

# two tiny networks: every planner applies to one of them (join_dp needs a join of two inputs)
_NETS = (("skip", {}), ("siamese", {"lengths": (1, 2), "width": 4}))
_LOADED: set[str] = set()  # planners whose kernels this process has loaded: a sweep's later runs skip them


@dataclass
class Loaded:
    """What :func:`load` did: its wall time and the planners neither tiny network could be planned
    with (each with the last reason), whose kernels are not loaded."""

    seconds: float = 0.0
    refused: dict[str, str] = field(default_factory=dict)


def load(planners: Iterable[str] | None = None) -> Loaded:
    """Compile (first time) or load from numba's cache every kernel of ``planners`` (default: every
    registered one) by planning two tiny networks with each strategy and memory model a planner
    takes; the kernels' argument types do not depend on the graph's size, so every later plan finds
    them loaded. A planner already loaded in this process costs nothing."""
    start = time.perf_counter()
    left = [m for m in dict.fromkeys(methods() if planners is None else planners) if m not in _LOADED]
    refused: dict[str, str] = {}
    for net, size in _NETS:
        if not left:
            break
        model, inputs = nets.build(net, batch_size=1, input_size=8, seed=0, **size)
        graph = trace(model, inputs)
        for method in list(left):
            s = spec(method)
            strategies = STRATEGIES if s.takes_strategy else (None,)
            models = PLANNING if s.takes_memory_model else (None,)
            try:
                for strategy, memory_model in itertools.product(strategies, models):
                    options = {} if memory_model is None else {"memory_model": memory_model}
                    plan(graph, method, strategy=strategy, **options)
            except ValueError as e:  # the planner does not apply to this net: join_dp on one input
                refused[method] = f"{net}: {type(e).__name__}: {e}"
            else:
                left.remove(method)
                refused.pop(method, None)
                _LOADED.add(method)
    return Loaded(time.perf_counter() - start, refused)
