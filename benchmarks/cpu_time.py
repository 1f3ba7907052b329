"""Real CPU training steps at a reduced input size: time overhead and measured peak per method.

    python -m benchmarks.cpu_time              # print the table
    python -m benchmarks.cpu_time --write      # and update docs/simulator.md

Plain eager training (``eager``) and every method's schedule on our executor (``vanilla`` is the
executor running the plan that recomputes nothing) run ``--iterations`` real steps (forward, loss,
backward) on the ``cpu`` backend in one thread, split over ``--rounds`` rounds that take the methods in
turn (each round after ``--warmup`` steps); the time is the median step, the peak
the most live tensor bytes during a step (parameters excluded; gradients included), the simulated
peak the simulator's for the same schedule. Sizes are reduced so that the table takes minutes.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from tqdm import tqdm

import recompute
from experiments import nets
from recompute.doors.measure import default_loss
from recompute.pricing.memory_model import PLANNING, MemoryModel

from .common import NON_NEGATIVE_INT, POSITIVE_INT, head_commit, made_by, markdown_table, write_doc

# network → (batch, input size) for CPU timing
SIZES = {"resnet50": (8, 64), "resnet152": (4, 64), "vgg19": (8, 64), "densenet161": (4, 64),
         "googlenet": (16, 64), "unet": (2, 128), "pspnet": (1, 128)}
METHODS = [("eager", None), ("vanilla", None), ("chen", None), ("approxdp", "tc"), ("approxdp", "mc"), ("exactdp", "tc"),
           ("exactdp", "mc")]
MIB = 2**20


def _label(method: str, strategy: str | None) -> str:
    return f"{method}-{strategy}" if strategy else method


def run(net_names: list[str], memory_model: str, warmup: int, iterations: int,
        methods: list[tuple[str, str | None]] = METHODS, rounds: int = 3) -> list[list[object]]:  # fmt: skip
    """Every method on every network; each method's ``iterations`` timed steps are split over ``rounds``
    rounds that take the methods in turn, so that a slow spell of a shared machine is not one method's."""
    torch.manual_seed(0)
    rows = []
    bar = tqdm(total=len(net_names) * len(methods) * rounds, desc="cpu time", leave=False)
    for name in net_names:
        batch, size = SIZES[name]
        model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
        graph = recompute.trace(model, inputs, loss_fn=default_loss)
        plans = {}
        for method, strategy in methods:
            options = {"memory_model": memory_model} if method.endswith("dp") else {}
            plans[method, strategy] = None if method == "eager" else recompute.plan(graph, method, strategy=strategy, **options)
        runners = {m: None if p is None else recompute.execute(graph, p) for m, p in plans.items()}
        times: dict[tuple[str, str | None], list[float]] = {m: [] for m in methods}
        peaks: dict[tuple[str, str | None], int] = {}
        for r in range(rounds):
            for m in methods:
                bar.set_postfix_str(f"{name} {_label(*m)} round {r + 1}")
                n = iterations // rounds + (r < iterations % rounds)
                out = recompute.measure(model, inputs, runner=runners[m], backend="cpu", warmup=warmup, iterations=n)
                times[m] += out.times
                peaks[m] = out.peak_bytes
                bar.update()
        base = methods[0]
        base_s, base_peak = statistics.median(times[base]), peaks[base]
        for m in methods:
            plan, seconds = plans[m], statistics.median(times[m])
            rows.append([name, f"{batch}×{size}²", _label(*m), f"{seconds:.3f}", f"{seconds / base_s:.3f}",
                         f"{peaks[m] / MIB:.1f}", "—" if plan is None else f"{plan.peak / MIB:.1f}",
                         f"{peaks[m] / base_peak - 1:+.1%}",
                         "—" if plan is None else f"{plan.overhead / graph.total_time():.0%}"])
    bar.close()
    return rows


HEADERS = ["network", "batch × input", "method", "s / step (median)", "time vs eager", "peak MiB (cpu)",
           "simulated MiB", "peak vs eager", "simulated overhead (of T(V))"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--memory-model", default=MemoryModel.simulator, choices=PLANNING, type=MemoryModel)
    parser.add_argument("--warmup", type=NON_NEGATIVE_INT, default=1)
    parser.add_argument("--iterations", type=POSITIVE_INT, default=9, help="timed steps per method, in all")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=3, help="rounds over the methods the steps are split into")
    labels = {_label(*m): m for m in METHODS}
    parser.add_argument("--methods", nargs="+", default=list(labels), choices=list(labels),
                        help="a subset (eager first: the ratios are to the first method)")
    parser.add_argument("--write", action="store_true", help="update docs/simulator.md")
    args = parser.parse_args()
    if args.rounds > args.iterations:  # a round would time no step
        parser.error(f"--rounds {args.rounds} is more than --iterations {args.iterations}: each round times at least one step")
    torch.set_num_threads(1)
    commit = head_commit()
    rows = run(args.nets, args.memory_model, args.warmup, args.iterations, [labels[m] for m in args.methods],
               args.rounds)
    text = f"{made_by(commit)}\n\n{markdown_table(HEADERS, rows)}"
    print(text)
    if args.write:
        write_doc("cpu-time-table", text)


if __name__ == "__main__":
    main()
