"""The time model against real CPU steps: predicted / measured step seconds, per network and plan.

    OMP_NUM_THREADS=1 python -m benchmarks.timemodel            # print the table
    OMP_NUM_THREADS=1 python -m benchmarks.timemodel --write    # and update docs/benchmarks.md

For each of the paper's seven networks at a reduced size (:data:`benchmarks.cpu_time.SIZES`), the
vanilla plan and three recomputing plans of different overhead run on our executor in one thread.
The measured time is the median over ``--steps`` steps (after one warm-up) of the thread's CPU time
(``time.thread_time``: the machine is shared, and wall time would count the other processes' turns).
The predicted time is :class:`recompute.timing.TimeModel`'s sum over the plan's schedule, every op
timed alone on the same clock with the core's private cache flushed before each call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date

import torch

import recompute
from recompute import nets
from recompute.measure import default_loss
from recompute.schedule import canonical
from recompute.timing import TimeModel, schedule_calls

from .common import REPO, head_commit, markdown_table, write_section
from .cpu_time import SIZES

# (label, method, strategy): no recomputation, then three plans of growing overhead
PLANS = [("vanilla", "vanilla", None), ("chen", "chen", None), ("approxdp-tc min", "approxdp", "tc"),
         ("approxdp-mc min", "approxdp", "mc")]
FLUSH_BYTES = 4 * 2**20  # twice this machine's 2 MiB L2 cache per core
HEADERS = ["network", "batch × input", "plan", "overhead (cost units)", "predicted overhead s", "predicted s",
           "measured s (median)", "predicted / measured"]


def step_seconds(runner: recompute.Executor, model: torch.nn.Module, inputs: tuple, steps: int) -> float:
    """Median thread CPU seconds of ``steps`` training steps after one warm-up."""
    times = []
    for i in range(steps + 1):
        start = time.thread_time()
        runner(*inputs).backward()
        elapsed = time.thread_time() - start
        for p in model.parameters():
            p.grad = None
        if i:
            times.append(elapsed)
    return statistics.median(times)


def run(names: list[str], steps: int, repeats: int) -> list[list[object]]:
    rows = []
    for name in names:
        batch, size = SIZES[name]
        model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
        graph = recompute.trace(model, inputs, loss_fn=default_loss)
        model_t = TimeModel(repeats=repeats, clock="thread", flush_bytes=FLUSH_BYTES)
        base = None
        for label, method, strategy in PLANS:
            p = recompute.plan(graph, method, strategy=strategy)
            predicted = model_t.seconds(schedule_calls(graph.program, p.schedule or canonical(graph, p.lower_sets)))
            base = predicted if base is None else base
            measured = step_seconds(recompute.execute(graph, p, model), model, inputs, steps)
            rows.append([name, f"{batch}×{size}²", label, p.overhead, f"{predicted - base:.3f}", f"{predicted:.3f}",
                         f"{measured:.3f}", f"{predicted / measured:.3f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--steps", type=int, default=5, help="timed steps per plan")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per op key")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = run(args.nets, args.steps, args.repeats)
    commit = head_commit()
    worst = max(abs(float(r[-1]) - 1) for r in rows)
    text = (f"`OMP_NUM_THREADS=1 python -m benchmarks.timemodel --write` (commit {commit}, {date.today()}; "
            f"largest error {worst:.1%})\n\n" + markdown_table(HEADERS, rows))
    print(text)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", "time-model", text)


if __name__ == "__main__":
    main()
