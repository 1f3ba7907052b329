"""The head-to-head's batch extrapolation against ops timed at larger batches: per op kind, and per allocator regime.

    OMP_NUM_THREADS=1 python -m benchmarks.extrapolation                       # ResNet-50, 224², probes 2 and 4
    OMP_NUM_THREADS=1 python -m benchmarks.extrapolation --targets 16 32 --net googlenet

The head-to-head prices a paper-scale step by :class:`recompute.timing.BatchExtrapolation`: each op
of the joint graph timed alone at the probe batches and extended linearly to the paper's. Here the
same ops are also timed at ``--targets`` batches and compared with what the probes predict for them,
in two regimes of glibc's allocator:

* ``glibc default``: an allocation above the dynamic mmap threshold (at most 32 MiB) is mapped on
  fresh pages, which the op's first writes fault in; below it, freed memory is reused. At the
  probes most outputs are below it, at the paper's batch most are above.
* ``fresh pages``: the threshold fixed at 128 KiB (``mallopt(M_MMAP_THRESHOLD)``), so that every
  output of any size is faulted in, at the probes as at the target.

The first regime runs first: fixing the threshold ends glibc's adjustment for the process.
"""

from __future__ import annotations

import argparse
import ctypes
from collections import defaultdict

import torch

from recompute.timing import OpCall, TimeModel, module_calls

from .common import markdown_table
from .head_to_head import PROBES, _capture

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
FRESH = 128 * 2**10  # bytes: an mmap threshold below nearly every activation


def _kind(call: OpCall) -> str:
    name = str(call.target)
    return name.split(".")[1] if "." in name else name


def compare(calls: dict[int, list[OpCall]], targets: list[int], top: int) -> list[list[object]]:
    """Rows (target, op kind or ``all``, timed s, extrapolated s, timed / extrapolated), the op kinds
    with the most timed seconds first; every op timed once per regime."""
    small, large = PROBES
    model = TimeModel(repeats=3, clock="thread", enough=0.05)
    cost = {b: model.costs(c) for b, c in calls.items()}
    rows = []
    for target in targets:
        slope = (target - small) / (large - small)
        extended = [s + max(l - s, 0.0) * slope for s, l in zip(cost[small], cost[large])]
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for call, timed, predicted in zip(calls[target], cost[target], extended):
            kinds[_kind(call)][0] += timed
            kinds[_kind(call)][1] += predicted
        ranked = [("all", [sum(cost[target]), sum(extended)]), *sorted(kinds.items(), key=lambda kv: -kv[1][0])[:top]]
        rows += [[target, kind, f"{t:.3f}", f"{e:.3f}", f"{t / e:.2f}"] for kind, (t, e) in ranked]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--targets", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--top", type=int, default=6, help="op kinds listed per target")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = sorted({*PROBES, *args.targets})
    calls = {b: module_calls(_capture(args.net, b, args.size).joint) for b in batches}
    headers = ["target batch", "ops", "timed s", f"extrapolated from {PROBES} s", "timed / extrapolated"]
    print(f"{args.net}, {args.size}², one thread\n\nglibc default\n")
    print(markdown_table(headers, compare(calls, args.targets, args.top)))
    if ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, FRESH) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: this needs glibc")
    print(f"\nfresh pages (mmap threshold {FRESH // 2**10} KiB)\n")
    print(markdown_table(headers, compare(calls, args.targets, args.top)))


if __name__ == "__main__":
    main()
