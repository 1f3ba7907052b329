"""Solve time of every planner on the traced graphs of the seven paper networks (paper batch sizes).

    python -m benchmarks.solve_time            # print the table
    python -m benchmarks.solve_time --write    # and update docs/benchmarks.md

Each time includes the smallest-budget search (``budget=None``) and is the best of ``--repeats`` runs
in one process, after a warm-up call that compiles the numba kernels (their cache is on disk, so a
later process only loads them).
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

import recompute
from recompute import nets
from recompute.memory_model import PLANNING, MemoryModel
from recompute.planners.dp import TooManyLowerSets, all_lower_sets

from .common import REPO, markdown_table, write_section

METHODS = [("chen", None), ("chen_greedy", None), ("approxdp", "tc"), ("approxdp", "mc"), ("exactdp", "tc"),
           ("exactdp", "mc")]


def best_time(graph: recompute.Graph, method: str, strategy: str | None, model: str, repeats: int) -> float:
    options = {"memory_model": model} if method.endswith("dp") else {}
    times = []
    for _ in range(repeats):
        times.append(recompute.plan(graph, method, strategy=strategy, **options).solve_seconds)
    return min(times)


def run(net_names: list[str], model: str, repeats: int) -> list[list[object]]:
    small = recompute.trace(*nets.build("resblock"))
    for method, strategy in METHODS:  # compile (or load) the numba kernels before timing
        recompute.plan(small, method, strategy=strategy)
    rows = []
    for name in tqdm(net_names, desc="solve time", leave=False):
        model_, inputs = nets.build(name, fake_inputs=True)
        graph = recompute.trace(model_, inputs)
        try:
            count: object = len(all_lower_sets(graph))
        except TooManyLowerSets as exc:
            count = f"> {exc.limit}"
        row: list[object] = [name, graph.n, count]
        for method, strategy in METHODS:
            try:
                row.append(f"{best_time(graph, method, strategy, model, repeats):.3f}")
            except TooManyLowerSets:
                row.append("too many lower sets")
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=nets.names(paper_only=True))
    parser.add_argument("--memory-model", default=MemoryModel.paper, choices=PLANNING, type=MemoryModel)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    headers = ["network", "#V", "#lower sets"] + [f"{m}{'-' + s if s else ''} s" for m, s in METHODS]
    table = markdown_table(headers, run(args.nets, args.memory_model, args.repeats))
    print(table)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", f"solve-time-{args.memory_model}", table)


if __name__ == "__main__":
    main()
