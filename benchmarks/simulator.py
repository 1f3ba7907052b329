"""Simulated vs measured peak of every planner's schedule on the seven paper networks.

    python -m benchmarks.simulator              # print the tables (``fake`` backend)
    python -m benchmarks.simulator --write      # and update docs/simulator.md
    python -m benchmarks.simulator --nets vgg19 --budgets 3
    python -m benchmarks.simulator --backend cuda --write   # on a CUDA GPU, the plans run for real

Each network is traced with the loss (``trace(..., loss_fn=default_loss)``) at the paper's batch size,
every method plans (the DPs priced by the simulator's block costs, ``recompute.blockcost``, at their
smallest feasible budget), and its schedule runs under FakeTensorMode with the storage meter. Then
exactdp and approxdp are solved for the same budgets between approxdp's smallest peak and vanilla's,
and each plan is measured against its budget. Parameters are not included (add them for the paper's
totals).

With ``--backend cuda`` each network and its inputs are real tensors on the GPU and each schedule runs
for real (``torch.cuda.max_memory_allocated`` above what existed before the step): what the caching
allocator hands out against what the simulator predicts, the ops' workspaces included (traced on the
GPU, each op's is measured there: ``recompute.workspace``). Its table goes to its own section, headed
by the device, torch version, commit and command.
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

import recompute
from experiments import nets
from recompute.doors.measure import default_loss

from .common import POSITIVE_INT, head_commit, made_by, markdown_table, write_doc

METHODS = [("vanilla", None), ("chen", None), ("chen_greedy", None), ("approxdp", "tc"), ("approxdp", "mc"),
           ("exactdp", "tc"), ("exactdp", "mc")]
GIB = 2**30


def _solve(graph: recompute.Graph, method: str, strategy: str | None, budget: int | None = None) -> recompute.Plan:
    return recompute.plan(graph, method, strategy=strategy, budget=budget)


def _measure(model, inputs, graph, plan, backend: str = "fake") -> int:
    runner = recompute.execute(graph, plan)
    return recompute.measure(model, inputs, runner=runner, backend=backend, iterations=1).peak_bytes


def run(net_names: list[str], n_budgets: int, slow: tuple[str, ...] = (),
        backend: str = "fake") -> tuple[list[list[object]], list[list[object]]]:
    """The two tables, each plan measured on ``backend``; exactdp is not solved for budgets on the
    networks in ``slow``."""
    peaks, budgets = [], []
    bar = tqdm(total=len(net_names) * (len(METHODS) + 4 * n_budgets), desc="simulator", leave=False)
    for name in net_names:
        if backend == "cuda":
            model, inputs = nets.build(name, seed=0)
            model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
        else:
            model, inputs = nets.build(name, fake_inputs=True)
        start = time.perf_counter()
        graph = recompute.trace(model, inputs, loss_fn=default_loss)
        trace_s = time.perf_counter() - start
        smallest: dict[tuple[str, str | None], int] = {}
        vanilla = 0
        for method, strategy in METHODS:
            bar.set_postfix_str(f"{name} {method} {strategy or ''}")
            plan = _solve(graph, method, strategy)
            got = _measure(model, inputs, graph, plan, backend)
            vanilla = vanilla or got
            smallest[(method, strategy)] = plan.peak
            peaks.append([name, f"{method}{'_' + strategy if strategy else ''}", f"{plan.peak / GIB:.3f}",
                          f"{got / GIB:.3f}", f"{plan.peak / got:.4f}", f"{got / vanilla - 1:+.1%}",
                          plan.overhead, f"{plan.solve_seconds:.2f}", f"{trace_s:.1f}"])
            tqdm.write(" | ".join(map(str, peaks[-1])))  # a run cut short still shows its rows
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
                    got = _measure(model, inputs, graph, plan, backend)
                    row += [f"{got / GIB:.3f}", "yes" if got <= budget else "**no**", plan.overhead]
                    bar.update()
                budgets.append(row)
                tqdm.write(" | ".join(map(str, row)))
    bar.close()
    return peaks, budgets


def headers(backend: str) -> tuple[list[str], list[str]]:
    """The two tables' headers, naming the backend the plans were measured on."""
    peak = ["network", "method", "simulated GiB", f"measured GiB ({backend})", "simulated / measured",
            "measured vs vanilla", "overhead", "solve s", "trace s"]
    budget = ["network", "strategy", "budget GiB", f"exactdp measured GiB ({backend})", "≤ budget", "exactdp overhead",
              f"approxdp measured GiB ({backend})", "≤ budget", "approxdp overhead"]
    return peak, budget


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=nets.names(paper_only=True))
    parser.add_argument("--budgets", type=POSITIVE_INT, default=2, help="budgets per DP between its smallest peak and vanilla")
    parser.add_argument("--slow", nargs="*", default=[], help="networks on which exactdp is not solved for budgets")
    parser.add_argument("--backend", default="fake", choices=("fake", "cuda"),
                        help="where the plans run: fake (paper scale on the CPU) or cuda (for real, on the GPU)")
    parser.add_argument("--write", action="store_true", help="update docs/simulator.md")
    args = parser.parse_args(argv)
    if args.backend == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--backend cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    commit = head_commit()
    peaks, budgets = run(args.nets, args.budgets, tuple(args.slow), args.backend)
    peak_headers, budget_headers = headers(args.backend)
    text = (markdown_table(peak_headers, peaks) + "\n\nPlans solved for a budget (the simulated peak is what"
            " the budget bounds):\n\n" + markdown_table(budget_headers, budgets))
    device = [f"on {torch.cuda.get_device_name()}", f"torch {torch.__version__}"] if args.backend == "cuda" else []
    text = f"{made_by(commit, *device, argv=argv)}\n\n{text}"
    print(text)
    if args.write:
        marker = "simulator-table" if args.backend == "fake" else "simulator-cuda-table"
        write_doc(marker, text)


if __name__ == "__main__":
    main()
