"""The Checkmate MILP beside the heuristics: overhead at the same simulated peak, bound and gap, solve time.

    python -m benchmarks.milp                               # print the tables (default networks)
    python -m benchmarks.milp --nets vgg19 unet --write     # and update docs/benchmarks.md
    python -m benchmarks.milp --time-limit 30 --max-nodes 40 --budgets 3

For each network at the paper's batch (``fake`` inputs; the traced step without the loss, as
``benchmarks.memory``), budgets on a grid from the smallest peak of the DPs (approxdp and exactdp,
tc and mc, ``liveness`` model) up to vanilla's (excluded): the overhead (eq. 1, % of T(V)) of
approxdp-TC, exactdp-TC and the MILP at that budget (each plan's simulated peak fits it), Chen's
where its one plan fits, and the MILP's bound, gap, status and HiGHS time. A second table puts the
smallest simulated peak the MILP reaches (its ``budget=None`` plan or any plan of the grid) beside
the best heuristic's.
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

import recompute
from recompute import nets
from recompute.plan import InfeasibleBudget
from recompute.planners.dp import TooManyLowerSets
from recompute.planners.milp import NoSolution

from .common import REPO, markdown_table, write_section

GIB = 2**30
DEFAULT_NETS = nets.names(paper_only=True)
HEURISTICS = [("approxdp", "tc"), ("approxdp", "mc"), ("exactdp", "tc"), ("exactdp", "mc")]


def _pct(overhead: int, total: int) -> str:
    return f"{100 * overhead / total:.1f}%"


def _try(graph: recompute.Graph, method: str, **kw: object) -> recompute.Plan | None:
    options = {"memory_model": "liveness"} if method.endswith("dp") else {}
    try:
        return recompute.plan(graph, method, **options, **kw)
    except (InfeasibleBudget, TooManyLowerSets, NoSolution):
        return None


def run(names: list[str], budgets: int, milp_options: dict) -> tuple[list[list[object]], list[list[object]]]:
    grid_rows, peak_rows = [], []
    for name in tqdm(names, desc="milp", leave=False):
        model, inputs = nets.build(name, fake_inputs=True)
        graph = recompute.trace(model, inputs)
        total = graph.total_time()
        vanilla = recompute.plan(graph, "vanilla").peak
        smallest = [p for p in (_try(graph, m, strategy=s) for m, s in HEURISTICS) if p is not None]
        chen = _try(graph, "chen")
        best = min(smallest + ([chen] if chen else []), key=lambda p: (p.peak, p.overhead))
        low = min(p.peak for p in smallest)
        found = [p for p in [_try(graph, "milp", **milp_options)] if p is not None]
        for i in range(budgets):
            budget = low + (vanilla - low) * i // budgets
            cells = []
            for method, strategy in (("approxdp", "tc"), ("exactdp", "tc")):
                p = _try(graph, method, strategy=strategy, budget=budget)
                cells.append(_pct(p.overhead, total) if p else "infeasible")
            cells.append(_pct(chen.overhead, total) if chen and chen.peak <= budget else "over budget")
            m = _try(graph, "milp", budget=budget, **milp_options)
            if m is None:
                cells += ["no solution", "", "", "", ""]
            else:
                found.append(m)
                cells += [f"{_pct(m.overhead, total)} ({m.peak / GIB:.2f})", _pct(m.info["bound"], total),
                          f"{m.info['gap']:.0%}",
                          f"{m.info['status']} ({m.info['solves']} solves, n={m.info['coarsened_to']})",
                          f"{m.info['highs_seconds']:.0f}"]
            grid_rows.append([name, f"{budget / GIB:.2f} ({(budget - low) / (vanilla - low):.0%})", *cells])
        least = min(found, key=lambda p: (p.peak, p.overhead)) if found else None
        peak_rows.append([
            name, graph.n, f"{vanilla / GIB:.2f}",
            f"{best.peak / GIB:.2f} ({best.method}{'-' + best.strategy if best.strategy else ''}, {_pct(best.overhead, total)})",
            f"{least.peak / GIB:.2f} ({_pct(least.overhead, total)}, {'budget=None' if least.budget is None else 'a grid budget'})"
            if least else "no solution",
            f"{least.info['coarsened_to']} / {least.info['status']} / {least.info['highs_seconds']:.0f}" if least else "",
        ])
    return grid_rows, peak_rows


GRID = ["network", "budget GiB (of DP-min → vanilla)", "approxdp-TC", "exactdp-TC", "chen", "MILP (its peak GiB)",
        "MILP bound", "gap", "MILP status", "HiGHS s"]
PEAKS = ["network", "#V", "vanilla GiB", "best heuristic GiB (overhead)", "MILP least simulated peak GiB (overhead, from)",
         "MILP n / status / HiGHS s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=DEFAULT_NETS)
    parser.add_argument("--budgets", type=int, default=3, help="budgets per network")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per HiGHS solve")
    parser.add_argument("--max-nodes", type=int, default=40, help="coarsen larger graphs to this many nodes")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    options = {"time_limit": args.time_limit, "max_nodes": args.max_nodes, "retries": args.retries}
    grid, peaks = run(args.nets, args.budgets, options)
    command = (f"python -m benchmarks.milp --nets {' '.join(args.nets)} --budgets {args.budgets} "
               f"--time-limit {args.time_limit:g} --max-nodes {args.max_nodes} --retries {args.retries}")
    text = f"`{command}`\n\n{markdown_table(GRID, grid)}\n\n{markdown_table(PEAKS, peaks)}"
    print(text)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", "milp-table", text)


if __name__ == "__main__":
    main()
