"""Real CPU training steps at a reduced input size: time overhead and measured peak per method.

    python -m benchmarks.cpu_time              # print the table
    python -m benchmarks.cpu_time --write      # and update docs/benchmarks.md

Each method runs ``--warmup`` + ``--iterations`` real steps (forward, loss, backward) on the ``cpu``
backend; the time is the median step, the peak the most live tensor bytes during a step (parameters
excluded; gradients included). Sizes are reduced so that the whole table takes minutes on 2 cores.
"""

from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

import recompute
from recompute import nets

from .common import REPO, markdown_table, write_section

# network → (batch, input size) for CPU timing
SIZES = {"resnet50": (8, 64), "resnet152": (4, 64), "vgg19": (8, 64), "densenet161": (4, 64),
         "googlenet": (16, 64), "unet": (2, 128), "pspnet": (1, 128)}
METHODS = [("vanilla", None), ("chen", None), ("approxdp", "tc"), ("approxdp", "mc"), ("exactdp", "tc"),
           ("exactdp", "mc")]
MIB = 2**20


def run(net_names: list[str], memory_model: str, warmup: int, iterations: int) -> list[list[object]]:
    torch.manual_seed(0)
    rows = []
    bar = tqdm(total=len(net_names) * len(METHODS), desc="cpu time", leave=False)
    for name in net_names:
        batch, size = SIZES[name]
        model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
        graph = recompute.trace(model, inputs)
        base = None
        for method, strategy in METHODS:
            bar.set_postfix_str(f"{name} {method} {strategy or ''}")
            options = {"memory_model": memory_model} if method.endswith("dp") else {}
            plan = recompute.plan(graph, method, strategy=strategy, **options)
            runner = None if method == "vanilla" else recompute.execute(graph, plan)
            r = recompute.measure(model, inputs, runner=runner, backend="cpu", warmup=warmup, iterations=iterations)
            base = base or r
            label = f"{method}-{strategy}" if strategy else method
            rows.append([name, f"{batch}×{size}²", label, f"{r.seconds:.3f}", f"{r.seconds / base.seconds:.2f}",
                         f"{r.peak_bytes / MIB:.0f}", f"{r.peak_bytes / base.peak_bytes - 1:+.0%}",
                         f"{plan.overhead / graph.total_time():.0%}"])
            bar.update()
    bar.close()
    return rows


HEADERS = ["network", "batch × input", "method", "s / step (median)", "time vs vanilla", "peak MiB (cpu)",
           "peak vs vanilla", "predicted overhead (of T(V))"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--memory-model", default="liveness", choices=["paper", "liveness"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    table = markdown_table(HEADERS, run(args.nets, args.memory_model, args.warmup, args.iterations))
    print(table)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", "cpu-time-table", table)


if __name__ == "__main__":
    main()
