"""The Checkmate MILP beside every planner: overhead at the same simulated peak, bound and gap, solve time.

    python -m benchmarks.milp                               # print the tables (the paper's seven networks)
    python -m benchmarks.milp --nets vgg19 unet --write     # and update docs/planners.md
    python -m benchmarks.milp --time-limit 30 --max-nodes 40 --budgets 3 --slow googlenet

For each network at the paper's batch (``fake`` inputs; the traced step without the loss, as
``benchmarks.memory``), budgets on a grid from the smallest simulated peak of the DPs (approxdp and
exactdp, tc and mc, with their default ``simulator`` memory model) up to vanilla's (excluded). At each
budget, every planner of ``PLANNERS`` is asked for a plan whose simulated peak (``plan.peak``, = the
measured one) fits it: the DPs and ``revolve``/``join_dp`` search for the least overhead within it, the
others have one plan each, shown only where it fits. A cell is the overhead (eq. 1 or Σ T_v over every
recomputation, % of T(V)), its difference from the MILP's overhead at that budget (points of T(V);
negative: the planner beats the MILP's schedule) and the planner's solve time; "—" where no plan fits.
The MILP columns: its overhead and simulated peak, HiGHS's bound on the (coarse) program, its gap,
status and HiGHS time. A second table puts the smallest simulated peak the MILP reaches (its
``budget=None`` plan or any plan of the grid) beside the smallest of every other planner.
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

import recompute
from experiments import nets
from recompute.planners.registry import InfeasibleBudget
from recompute.core.families import TooManyLowerSets
from recompute.planners.milp import NoSolution

from .common import NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT, head_commit, made_by, markdown_table, write_doc

GIB = 2**30
DEFAULT_NETS = nets.names(paper_only=True)
SMALLEST = [("approxdp", "tc"), ("approxdp", "mc"), ("exactdp", "tc"), ("exactdp", "mc")]  # the grid's low end
PLANNERS = [("approxdp", "tc"), ("exactdp", "tc"), ("chen", None), ("chen_greedy", None), ("reforward", None),
            ("reforward_linear", None), ("revolve", None), ("chen_recursive", None), ("join_dp", None)]
WARM = [("approxdp", "tc"), ("exactdp", "tc")]  # the MILP starts from the better of their plans at each budget


def _label(method: str, strategy: str | None) -> str:
    return f"{method}-{strategy.upper()}" if strategy else method


def _pct(overhead: float, total: int) -> str:
    return f"{100 * overhead / total:.1f}%"


def _try(graph: recompute.Graph, method: str, **kw: object) -> recompute.Plan | None:
    """The plan, or None where the method has none (budget too small, too many lower sets, no MILP
    schedule in the time limit)."""
    try:
        return recompute.plan(graph, method, **kw)
    except (InfeasibleBudget, TooManyLowerSets, NoSolution):
        return None


def _applies(name: str, method: str) -> bool:
    """join_dp plans a join of one branch per input: networks with one input are no join."""
    return method != "join_dp" or nets.spec(name).num_inputs >= 2


def _cell(p: recompute.Plan | None, milp: recompute.Plan | None, total: int) -> str:
    if p is None:
        return "—"
    delta = f"{100 * (p.overhead - milp.overhead) / total:+.1f}; " if milp is not None else ""
    return f"{_pct(p.overhead, total)} ({delta}{p.solve_seconds:.1f} s)"


def run(names: list[str], budgets: int, milp_options: dict, slow: tuple[str, ...] = ()) -> tuple[list[list[object]], list[list[object]]]:  # fmt: skip
    """The grid and the smallest-peak tables; exactdp is not solved for budgets on the networks in ``slow``."""
    grid_rows, peak_rows = [], []
    for name in tqdm(names, desc="milp", leave=False):
        model, inputs = nets.build(name, fake_inputs=True)
        graph = recompute.trace(model, inputs)
        total = graph.total_time()
        vanilla = recompute.plan(graph, "vanilla").peak
        planners = [(m, s) for m, s in PLANNERS if _applies(name, m)]
        smallest = {(m, s): _try(graph, m, strategy=s) for m, s in dict.fromkeys(SMALLEST + planners)}
        low = min(smallest[k].peak for k in SMALLEST if smallest[k] is not None)
        least_dp = [smallest[k] for k in WARM if smallest[k] is not None]
        found = [p for p in [_try(graph, "milp", warm_start=least_dp, **milp_options)] if p is not None]
        # a planner's cell when it is not solved at the budgets: why
        skipped = {(m, s): "n/a" if not _applies(name, m) else "not run" if m == "exactdp" and name in slow else None
                   for m, s in PLANNERS}
        for i in range(budgets):
            budget = low + (vanilla - low) * i // budgets
            plans = {k: None if skipped[k] else _try(graph, k[0], strategy=k[1], budget=budget) for k in PLANNERS}
            warm = [plans[k] for k in WARM if plans[k] is not None]
            m = _try(graph, "milp", budget=budget, warm_start=warm, **milp_options)
            cells = [skipped[k] or _cell(plans[k], m, total) for k in PLANNERS]
            if m is None:
                cells += ["no solution", "", "", "", ""]
            else:
                found.append(m)
                start = m.info["warm_overhead"]
                cells += [f"{_pct(m.overhead, total)} ({m.peak / GIB:.2f}; {m.model_peak / GIB:.2f})",
                          _pct(m.info["bound"], total), f"{m.info['gap']:.0%}",
                          f"{m.info['status']} ({m.info['solves']} solves, n={m.info['coarsened_to']}, "
                          f"warm {'—' if start is None else _pct(start, total)})",
                          f"{m.info['highs_seconds']:.0f}"]
            grid_rows.append([name, f"{budget / GIB:.2f} ({(budget - low) / (vanilla - low):.0%})", *cells])
        best = min((p for p in smallest.values() if p is not None), key=lambda p: (p.peak, p.overhead))
        least = min(found, key=lambda p: (p.peak, p.overhead)) if found else None
        peak_rows.append([
            name, graph.n, f"{vanilla / GIB:.2f}", f"{low / GIB:.2f}",
            f"{best.peak / GIB:.2f} ({_label(best.method, best.strategy)}, {_pct(best.overhead, total)})",
            f"{least.peak / GIB:.2f} ({_pct(least.overhead, total)}, {'budget=None' if least.budget is None else 'a grid budget'})"
            if least else "no solution",
            f"{least.info['coarsened_to']} / {least.info['status']} / {least.info['highs_seconds']:.0f}" if least else "",
        ])
    return grid_rows, peak_rows


GRID = ["network", "budget GiB (of DP-min → vanilla)", *(_label(m, s) for m, s in PLANNERS),
        "MILP (simulated; program peak GiB)", "MILP bound", "gap", "MILP status", "HiGHS s"]
PEAKS = ["network", "#V", "vanilla GiB", "DP-min GiB", "least peak of the other planners GiB (overhead)",
         "MILP least simulated peak GiB (overhead, from)", "MILP n / status / HiGHS s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=DEFAULT_NETS)
    parser.add_argument("--budgets", type=POSITIVE_INT, default=3, help="budgets per network")
    parser.add_argument("--time-limit", type=POSITIVE, default=30.0, help="seconds per HiGHS solve")
    parser.add_argument("--max-nodes", type=POSITIVE_INT, default=40, help="coarsen larger graphs to this many nodes")
    parser.add_argument("--retries", type=NON_NEGATIVE_INT, default=2)
    parser.add_argument("--slow", nargs="*", default=[], help="networks on which exactdp is not solved for budgets")
    parser.add_argument("--write", action="store_true", help="update docs/planners.md")
    args = parser.parse_args()
    options = {"time_limit": args.time_limit, "max_nodes": args.max_nodes, "retries": args.retries}
    commit = head_commit()
    grid, peaks = run(args.nets, args.budgets, options, tuple(args.slow))
    settings = (f"nets {' '.join(args.nets)}, {args.budgets} budgets, {args.time_limit:g} s per solve, "
                f"graphs coarsened to {args.max_nodes} nodes, {args.retries} retries"
                + (f", exactdp not solved for budgets on {' '.join(args.slow)}" if args.slow else ""))
    text = f"{made_by(commit, settings)}\n\n{markdown_table(GRID, grid)}\n\n{markdown_table(PEAKS, peaks)}"
    print(text)
    if args.write:
        write_doc("milp-table", text)


if __name__ == "__main__":
    main()
