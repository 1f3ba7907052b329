"""Solve time of every planner on the traced graphs of the seven paper networks (paper batch sizes).

    python -m benchmarks.solve_time            # print the table
    python -m benchmarks.solve_time --write    # and update docs/planners.md
    python -m benchmarks.solve_time --app --write   # the app's records: one `python run.py` per cell

Each time includes the smallest-budget search (``budget=None``) and is the best of ``--repeats`` runs
in one process, after :func:`experiments.kernels.load` (the numba kernels compiled, or loaded from their
cache on disk). Repeats after the first find the lower-set family built (it is kept on the graph).
Each cell gives two times: the planner alone on the graph without its program (what the paper's
planners do: the DP's smallest budget in its own model), and in brackets ``recompute.plan`` on the
traced graph, which also prices the plan with the simulator and, for the DPs, probes five budgets
above the DP's own smallest for the smallest simulated peak (``recompute.planners.registry._smallest``). ``--app`` gives what a user's run records: a fresh process per network ×
method on the ``fake`` backend, its ``solve_seconds`` (a first solve on that graph) beside
``kernel_seconds`` (numba's once-per-process load, done before the solve is timed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import replace

from tqdm import tqdm

import recompute
from experiments import results
from experiments import kernels
from experiments import nets
from recompute.pricing.memory_model import PLANNING, MemoryModel
from recompute.core.families import TooManyLowerSets, all_lower_sets

from .common import POSITIVE_INT, REPO, head_commit, made_by, markdown_table, write_doc

METHODS = [("chen", None), ("chen_greedy", None), ("approxdp", "tc"), ("approxdp", "mc"), ("exactdp", "tc"),
           ("exactdp", "mc")]


def best_time(graph: recompute.Graph, method: str, strategy: str | None, model: str, repeats: int) -> float:
    options = {"memory_model": model} if method.endswith("dp") else {}
    return min(recompute.plan(graph, method, strategy=strategy, **options).solve_seconds for _ in range(repeats))


def run(net_names: list[str], model: str, repeats: int) -> list[list[object]]:
    kernels.load({m for m, _ in METHODS})
    rows = []
    for name in tqdm(net_names, desc="solve time", leave=False):
        model_, inputs = nets.build(name, fake_inputs=True)
        graph = recompute.trace(model_, inputs)
        alone = replace(graph, program=None)  # the planner without the simulator's pricing and probes
        try:
            count: object = len(all_lower_sets(graph))
        except TooManyLowerSets as exc:
            count = f"> {exc.limit}"
        row: list[object] = [name, graph.n, count]
        for method, strategy in METHODS:
            try:
                row.append(f"{best_time(alone, method, strategy, model, repeats):.3f} "
                           f"({best_time(graph, method, strategy, model, repeats):.3f})")
            except TooManyLowerSets:
                row.append("too many lower sets")
        rows.append(row)
    return rows


APP_METHODS = ("approxdp_tc", "approxdp_mc")  # the app's method options (experiments.config.method_configs) whose records are tabulated


def app_rows(net_names: list[str], methods: tuple[str, ...] = APP_METHODS) -> list[list[object]]:
    """One ``python run.py net=<net> method=<m> device=fake`` per cell, in its own process and results
    store; the records' ``solve_seconds`` and ``kernel_seconds``."""
    rows = []
    with tempfile.TemporaryDirectory() as store:
        for name in tqdm(net_names, desc="app runs", leave=False):
            row: list[object] = [name]
            for method in methods:
                subprocess.run([sys.executable, "run.py", f"net={name}", f"method={method}", "device=fake", "logger=none",
                                "iterations=1", "warmup=0", f"results_dir={store}", f"hydra.run.dir={store}/hydra",
                                "hydra.output_subdir=null"], cwd=REPO, check=True, capture_output=True)
                rec = results.load(store).query("net == @name and method == @method").iloc[-1]
                row.append(f"{rec.solve_seconds:.2f} (+{rec.kernel_seconds:.2f})")
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=nets.names(paper_only=True))
    parser.add_argument("--memory-model", default=MemoryModel.paper, choices=PLANNING, type=MemoryModel)
    parser.add_argument("--repeats", type=POSITIVE_INT, default=3)
    parser.add_argument("--app", action="store_true", help="the app's records (simulator, a fresh process per cell)")
    parser.add_argument("--write", action="store_true", help="update docs/planners.md")
    args = parser.parse_args()
    commit = head_commit()
    if args.app:
        table = markdown_table(["network", *(f"{m} solve s (+kernel load s)" for m in APP_METHODS)], app_rows(args.nets))
        marker = "solve-time-app"
    else:
        headers = ["network", "#V", "#lower sets"] + [f"{m}{'-' + s if s else ''} s (plan() on the trace)" for m, s in METHODS]
        table = markdown_table(headers, run(args.nets, args.memory_model, args.repeats))
        marker = f"solve-time-{args.memory_model}"
    text = f"{made_by(commit)}\n\n{table}"
    print(text)
    if args.write:
        write_doc(marker, text)


if __name__ == "__main__":
    main()
