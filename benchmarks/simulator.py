"""Simulated vs measured peak of every planner's schedule on the seven paper networks (``fake`` backend).

    python -m benchmarks.simulator              # print the tables
    python -m benchmarks.simulator --write      # and update docs/benchmarks.md
    python -m benchmarks.simulator --nets vgg19 --budgets 3

Each network is traced with the loss (``trace(..., loss_fn=default_loss)``) at the paper's batch size,
every method plans (the DPs priced by the simulator's block costs, ``recompute.blockcost``, at their
smallest feasible budget), and its schedule runs under FakeTensorMode with the storage meter. Then
exactdp and approxdp are solved for the same budgets between approxdp's smallest peak and vanilla's,
and each plan is measured against its budget. Parameters are not included (add them for the paper's
totals).
"""

from __future__ import annotations

import argparse
import time

from tqdm import tqdm

import recompute
from recompute import nets
from recompute.measure import default_loss

from .common import REPO, markdown_table, write_section

METHODS = [("vanilla", None), ("chen", None), ("chen_greedy", None), ("approxdp", "tc"), ("approxdp", "mc"),
           ("exactdp", "tc"), ("exactdp", "mc")]
GIB = 2**30


def _solve(graph: recompute.Graph, method: str, strategy: str | None, budget: int | None = None) -> recompute.Plan:
    return recompute.plan(graph, method, strategy=strategy, budget=budget)


def _measure(model, inputs, graph, plan) -> int:
    return recompute.measure(model, inputs, runner=recompute.execute(graph, plan), backend="fake").peak_bytes


def run(net_names: list[str], n_budgets: int, slow: tuple[str, ...] = ()) -> tuple[list[list[object]], list[list[object]]]:
    """The two tables; exactdp is not solved for budgets on the networks in ``slow``."""
    peaks, budgets = [], []
    bar = tqdm(total=len(net_names) * (len(METHODS) + 4 * n_budgets), desc="simulator", leave=False)
    for name in net_names:
        model, inputs = nets.build(name, fake_inputs=True)
        start = time.perf_counter()
        graph = recompute.trace(model, inputs, loss_fn=default_loss)
        trace_s = time.perf_counter() - start
        smallest: dict[tuple[str, str | None], int] = {}
        vanilla = 0
        for method, strategy in METHODS:
            bar.set_postfix_str(f"{name} {method} {strategy or ''}")
            plan = _solve(graph, method, strategy)
            got = _measure(model, inputs, graph, plan)
            vanilla = vanilla or got
            smallest[(method, strategy)] = plan.peak
            peaks.append([name, f"{method}{'_' + strategy if strategy else ''}", f"{plan.peak / GIB:.3f}",
                          f"{got / GIB:.3f}", f"{plan.peak / got:.4f}", f"{got / vanilla - 1:+.1%}",
                          plan.overhead, f"{plan.solve_seconds:.2f}", f"{trace_s:.1f}"])
            bar.update()
        for strategy in ("tc", "mc"):
            low = smallest[("approxdp", strategy)]
            for j in range(1, n_budgets + 1):
                budget = low + (vanilla - low) * j // (n_budgets + 1)
                row = [name, strategy, f"{budget / GIB:.3f}"]
                for method in ("exactdp", "approxdp"):
                    if method == "exactdp" and name in slow:
                        row += ["—", "—", "—"]
                        continue
                    bar.set_postfix_str(f"{name} {method} {strategy} budget {j}")
                    plan = _solve(graph, method, strategy, budget)
                    got = _measure(model, inputs, graph, plan)
                    row += [f"{got / GIB:.3f}", "yes" if got <= budget else "**no**", plan.overhead]
                    bar.update()
                budgets.append(row)
    bar.close()
    return peaks, budgets


PEAK_HEADERS = ["network", "method", "simulated GiB", "measured GiB (fake)", "simulated / measured",
                "measured vs vanilla", "overhead", "solve s", "trace s"]
BUDGET_HEADERS = ["network", "strategy", "budget GiB", "exactdp measured GiB", "≤ budget", "exactdp overhead",
                  "approxdp measured GiB", "≤ budget", "approxdp overhead"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=nets.names(paper_only=True))
    parser.add_argument("--budgets", type=int, default=2, help="budgets per DP between its smallest peak and vanilla")
    parser.add_argument("--slow", nargs="*", default=[], help="networks on which exactdp is not solved for budgets")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    peaks, budgets = run(args.nets, args.budgets, tuple(args.slow))
    text = (markdown_table(PEAK_HEADERS, peaks) + "\n\nPlans solved for a budget (the simulated peak is what"
            " the budget bounds):\n\n" + markdown_table(BUDGET_HEADERS, budgets))
    print(text)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", "simulator-table", text)


if __name__ == "__main__":
    main()
