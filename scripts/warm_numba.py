"""Compile the planners' numba kernels into numba's on-disk cache (``@numba.njit(cache=True)``).

Run by ``scripts/install.sh`` whenever a kernel's source is newer than the last warm-up: without it the
first plan of a fresh install spends 20–30 s compiling (``python run.py``: solve_seconds 32 s cold,
0.9 s warm on ResNet-50). It plans two tiny networks (one input; a join of two) with every registered
planner, strategy and memory model it takes, so every kernel is compiled for the argument types
planning uses at any size (the arrays' dtypes and ranks do not depend on the graph).

    .venv/bin/python scripts/warm_numba.py
"""

from __future__ import annotations

import itertools
import time

import recompute
from recompute import nets
from recompute.memory_model import PLANNING
from recompute.plan import STRATEGIES, spec


def main() -> None:
    start = time.perf_counter()
    planned: set[str] = set()
    refusals: dict[str, str] = {}
    for net, size in (("skip", {}), ("siamese", {"lengths": (1, 2), "width": 4})):  # every planner applies to one
        model, inputs = nets.build(net, batch_size=1, input_size=8, seed=0, **size)
        graph = recompute.trace(model, inputs)
        for method in recompute.methods():
            s = spec(method)
            strategies = STRATEGIES if s.takes_strategy else (None,)
            models = PLANNING if s.takes_memory_model else (None,)
            for strategy, memory_model in itertools.product(strategies, models):
                options = {} if memory_model is None else {"memory_model": memory_model}
                try:
                    recompute.plan(graph, method, strategy=strategy, **options)
                    planned.add(method)
                except ValueError as e:  # a planner that does not apply to this net: join_dp on one input
                    refusals[method] = f"{net}: {type(e).__name__}: {e}"
    for method in sorted(set(refusals) - planned):  # refused by both nets: its kernels are not cached
        print(f"warm_numba: {method} did not plan ({refusals[method]})"[:200])
    print(f"warm_numba: kernels compiled and cached in {time.perf_counter() - start:.1f} s")

if __name__ == "__main__":
    main()
