"""The head-to-head's batch extrapolation against ops timed at larger batches: per op kind, and per allocator regime.

    OMP_NUM_THREADS=1 python -m benchmarks.extrapolation                       # ResNet-50, 224², its probes (2 and 4)
    OMP_NUM_THREADS=1 python -m benchmarks.extrapolation --targets 32 --net googlenet --regimes default huge

The head-to-head prices a paper-scale step by :class:`recompute.capture.timing.BatchExtrapolation`: each op
of the joint graph timed alone at the probe batches (``--probes``, else the network's in the
head-to-head) and extended linearly to the paper's. Here the same ops are also timed at ``--targets``
batches and compared with what the probes predict for them, under settings of the CPU allocator and
the cache, each in a process of its own (the allocator's hold for a process's life):

* ``glibc default``: an allocation above glibc's dynamic mmap threshold (at most 32 MiB) is mapped
  on fresh 4-KiB pages, which the op's first writes fault in; below it, freed memory is reused. At
  the probes most outputs are below it, at the paper's batch most are above.
* ``fresh pages``: the threshold fixed at 128 KiB (``mallopt(M_MMAP_THRESHOLD)``), so that every
  output of any size is faulted in, at the probes as at the target.
* ``huge pages``: PyTorch's ``THP_MEM_ALLOC_ENABLE=1``, every tensor of 2 MiB or more on transparent
  huge pages, a 512th of the faults (the head-to-head's setting, :data:`~benchmarks.head_to_head.HUGE_PAGES`);
* and with the shared cache flushed before each timed call, as no op's operands fit in it at the
  paper's batch (:func:`~benchmarks.head_to_head.probe_model`; slow: a 64-MiB write per timed call).
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
from collections import defaultdict
from typing import Any, Callable, TypeVar

import torch

from recompute.capture.timing import OpCall, module_calls

from .common import POSITIVE_INT, markdown_table
from .head_to_head import HUGE_PAGES, PROBES, _capture, probe_model, probes_of

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
FRESH = 128 * 2**10  # bytes: an mmap threshold below nearly every activation
T = TypeVar("T")


def op_kind(call: OpCall) -> str:
    """The ATen op a call runs, without its overload (``convolution_backward``)."""
    name = str(call.target)
    return name.split(".")[1] if "." in name else name


def compare(calls: dict[int, list[OpCall]], targets: list[int], top: int, flush: bool = False,
            probes: tuple[int, int] = PROBES) -> list[list[object]]:
    """Rows (target, op kind or ``all``, timed s, extrapolated from ``probes`` s, timed / extrapolated),
    the op kinds with the most timed seconds first; every op timed once per regime."""
    small, large = probes
    model = probe_model(flush=flush)
    cost = {b: model.costs(c) for b, c in calls.items()}
    rows = []
    for target in targets:
        slope = (target - small) / (large - small)
        extended = [s + max(l - s, 0.0) * slope for s, l in zip(cost[small], cost[large])]
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for call, timed, predicted in zip(calls[target], cost[target], extended):
            kinds[op_kind(call)][0] += timed
            kinds[op_kind(call)][1] += predicted
        ranked = [("all", [sum(cost[target]), sum(extended)]), *sorted(kinds.items(), key=lambda kv: -kv[1][0])[:top]]
        rows += [[target, kind, f"{t:.3f}", f"{e:.3f}", f"{t / e:.2f}"] for kind, (t, e) in ranked]
    return rows


# --regimes name → (title, environment, mmap threshold fixed by mallopt or None, shared cache flushed before each timed call)
REGIMES: dict[str, tuple[str, dict[str, str], int | None, bool]] = {
    "default": ("glibc default", {"THP_MEM_ALLOC_ENABLE": "0"}, None, False),
    "fresh": (f"fresh pages (mmap threshold {FRESH // 2**10} KiB)", {"THP_MEM_ALLOC_ENABLE": "0"}, FRESH, False),
    "huge": ("huge pages (THP_MEM_ALLOC_ENABLE=1), the head-to-head's", HUGE_PAGES, None, False),
    "flushed": ("huge pages, shared cache flushed", HUGE_PAGES, None, True),
}


def _regime(net: str, size: int, targets: list[int], top: int, threshold: int | None, flush: bool,
            probes: tuple[int, int]) -> list[list[object]]:
    """:func:`compare`'s rows, in a process whose allocator was set before its first allocation."""
    torch.set_num_threads(1)
    if threshold is not None and ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: this needs glibc")
    calls = {b: module_calls(_capture(net, b, size).joint) for b in sorted({*probes, *targets})}
    return compare(calls, targets, top, flush, probes)


def in_process(env: dict[str, str], fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a spawned process that starts with ``env`` in its environment (set here too:
    a process inherits the environment it is started with)."""
    os.environ.update(env)
    pool = multiprocessing.get_context("spawn").Pool(1)
    result = pool.apply(fn, args)
    pool.close()  # and wait for it: terminating it (``with``) leaks its semaphore
    pool.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--size", type=POSITIVE_INT, default=224)
    parser.add_argument("--targets", type=POSITIVE_INT, nargs="+", default=[16, 32])
    parser.add_argument("--top", type=POSITIVE_INT, default=6, help="op kinds listed per target")
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    parser.add_argument("--probes", type=POSITIVE_INT, nargs=2, help="small and large probe batch (default: the head-to-head's for --net)")
    args = parser.parse_args()
    probes = tuple(args.probes) if args.probes else probes_of(args.net)
    headers = ["target batch", "ops", "timed s", f"extrapolated from {probes} s", "timed / extrapolated"]
    print(f"{args.net}, {args.size}², one thread", flush=True)
    for title, env, threshold, flush in (REGIMES[r] for r in args.regimes):  # every regime sets the same keys
        rows = in_process(env, _regime, args.net, args.size, args.targets, args.top, threshold, flush, probes)
        print(f"\n{title}\n\n{markdown_table(headers, rows)}", flush=True)


if __name__ == "__main__":
    main()
