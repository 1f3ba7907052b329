"""Compile the planners' numba kernels into numba's on-disk cache (``@numba.njit(cache=True)``).

Run by ``scripts/install.sh`` whenever a kernel's source is newer than the last warm-up: without it the
first plan of a fresh install spends 20–30 s compiling (``python run.py``: solve_seconds 32 s cold,
0.9 s warm on ResNet-50). :func:`experiments.kernels.load` plans two tiny networks (one input; a join of
two) with every registered planner, strategy and memory model it takes, so every kernel is compiled for
the argument types planning uses at any size (the arrays' dtypes and ranks do not depend on the graph).

    .venv/bin/python scripts/warm_numba.py
"""

from __future__ import annotations

from experiments import kernels


def main() -> None:
    loaded = kernels.load()
    for method, why in sorted(loaded.refused.items()):  # its kernels are not cached
        print(f"warm_numba: {method} did not plan ({why})"[:200])
    print(f"warm_numba: kernels compiled and cached in {loaded.seconds:.1f} s")


if __name__ == "__main__":
    main()
