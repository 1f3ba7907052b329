"""Ground truth on real tensors: measured peak and step time of eager, PyTorch's methods and ours.

    python -m benchmarks.ground_truth              # print the table (ResNet-50, DenseNet-161, GoogLeNet; ~40 min)
    python -m benchmarks.ground_truth --write      # and docs/benchmarks.md

The head-to-head (:mod:`benchmarks.head_to_head`) prices every method without running it; this runs
them. Per network, at 224² and the smallest batch of :data:`BATCHES` where activations are at least
80% of plain training's peak (the ``fake`` backend decides), every method of :data:`METHODS` trains in
a process of its own (spawned, one thread): one warm-up step (``torch.compile`` compiles there), then
one step whose peak is measured, then ``--steps`` timed steps (wall clock, median).

The peak is the operating system's: the process's resident-set high-water mark during the step
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before it) less its resident set before the
step, plus the parameters and buffers. It sees what inductor's generated code allocates, which no
dispatch mode does. glibc is told to map every block of 64 KiB or more on its own
(``MALLOC_MMAP_THRESHOLD_``), so a freed tensor leaves the resident set at once and the mark is the
step's live bytes (plus the allocator's page rounding), not what malloc kept from earlier steps.

``predicted`` is the simulator's peak for the partitions of the compiled step (PyTorch's min-cut
under the budget, ours; :func:`recompute.partitions.price` on the same joint graph traced on
``meta``) and the plan's simulated peak for our executor; eager methods have none. Inductor fuses
pointwise ops, so a compiled step may hold less than its unfused partition predicts. Ours through
inductor is planned at the peak PyTorch's budget-0.5 partition is predicted to reach
(``at min_cut 0.5's peak``): the comparison at the same peak that the issue asks for.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

import recompute
from recompute import nets, partitions
from recompute.dynamo import Backend
from recompute.measure import default_loss

from .common import POSITIVE_INT, REPO, head_commit, made_by, markdown_table, write_section

NETWORKS = ("resnet50", "densenet161", "googlenet")
BATCHES = (4, 8, 16, 32)
SIZE = 224
ACTIVATION_SHARE = 0.8
COMPILE_BUDGET = 0.5  # the activation_memory_budget ours through inductor is compared at
GIB = 2**30
# (label, family, how the step runs, options): "eager" the model itself; "optimize" recompute.optimize (our
# executor, or PyTorch's method as a baseline); "compile" torch.compile with recompute.backend(runtime="inductor")
METHODS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("eager", "pytorch", "eager", {}),
    ("checkpoint per block", "pytorch", "optimize", {"method": "torch_checkpoint_blocks"}),
    ("checkpoint_sequential √n", "pytorch", "optimize", {"method": "torch_checkpoint_sequential", "segments": 0}),
    ("compile (inductor)", "pytorch", "optimize", {"method": "torch_compile_budget", "budget_fraction": 1.0}),
    (f"compile budget {COMPILE_BUDGET:g}", "pytorch", "optimize",
     {"method": "torch_compile_budget", "budget_fraction": COMPILE_BUDGET}),
    ("compile budget 0.1", "pytorch", "optimize", {"method": "torch_compile_budget", "budget_fraction": 0.1}),
    ("executor approxdp-tc min", "ours", "optimize", {"method": "approxdp", "strategy": "tc"}),
    ("executor approxdp-mc", "ours", "optimize", {"method": "approxdp", "strategy": "mc"}),
    ("inductor vanilla+remat 0", "ours", "compile", {"method": "vanilla", "remat": 0.0}),
    (f"inductor approxdp-tc at min_cut {COMPILE_BUDGET:g}'s peak +remat 0", "ours", "compile",
     {"method": "approxdp", "strategy": "tc", "remat": 0.0, "budget": "min_cut"}),
    ("inductor approxdp-tc min +remat 0", "ours", "compile", {"method": "approxdp", "strategy": "tc", "remat": 0.0}),
]
PLANNING = {"cost_model": "flops", "memory_model": "simulator"}


@dataclass
class Row:
    """One method's measured step on one network."""

    network: str
    batch_size: int
    input_size: int
    method: str
    family: str
    peak: int | None  # bytes, parameters and buffers included
    predicted: int | None
    seconds: float | None
    times: list[float]
    status: str = "ok"


def _status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}: a Linux kernel is needed for the resident-set peak")


def has_peak_meter() -> bool:
    """Whether this system can reset and read a process's resident-set peak (Linux ≥ 4.0)."""
    return os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/status")


def _reset_peak() -> None:
    """Reset the process's resident-set high-water mark (Linux ≥ 4.0) and hand freed heap back first."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def batch_for(name: str, size: int = SIZE) -> int:
    """The smallest batch of :data:`BATCHES` at 224² where activations are ≥ 80% of plain training's peak."""
    for b in BATCHES:
        model, inputs = nets.build(name, batch_size=b, input_size=size, seed=0)
        m = recompute.measure(model, inputs, backend="fake")
        if m.peak_bytes - m.grad_bytes >= ACTIVATION_SHARE * (m.peak_bytes + m.param_bytes):
            return b
    return BATCHES[-1]


def min_cut_peak(name: str, batch: int, size: int = SIZE) -> int:
    """The simulated peak (parameters left out, as a plan's budget counts) of PyTorch's min-cut partition
    at :data:`COMPILE_BUDGET` on the step's joint graph, traced on ``meta``."""
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0, fake_inputs=True)
    c = partitions.capture(model.to("meta"), [torch.empty(x.shape, device="meta") for x in inputs])
    fw, bw = partitions.torch_partition(c, COMPILE_BUDGET)
    return partitions.simulate_partition(fw, bw).peak


def _runner(model: torch.nn.Module, inputs: tuple, how: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """The callable one step runs, and (for ours) what predicts its peak: a Plan or a Backend."""
    if how == "eager":
        return model, None
    if how == "optimize":
        opts = dict(options)
        if opts["method"].startswith("torch_"):
            return recompute.optimize(model, method=opts.pop("method"), **opts), None
        runner = recompute.optimize(model, inputs, **opts, **PLANNING)
        return runner, runner
    opts = {"runtime": "inductor", **options, **({} if options["method"] == "vanilla" else PLANNING)}
    backend = recompute.backend(**opts)
    return torch.compile(model, backend=backend), backend


def measure_one(name: str, batch: int, size: int, label: str, family: str, how: str, options: dict[str, Any],
                steps: int) -> Row:
    """One method's step on real tensors in this process (see the module docstring)."""
    torch.set_num_threads(1)
    torch._dynamo.reset()
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
    runner, predictor = _runner(model, inputs, how, options)
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])

    def step() -> float:
        start = time.perf_counter()
        default_loss(runner(*inputs)).backward()
        elapsed = time.perf_counter() - start
        for p in model.parameters():
            p.grad = None
        return elapsed

    step()
    _reset_peak()
    before = _status_kb("VmRSS")
    step()
    peak = _status_kb("VmHWM") - before + params
    times = [step() for _ in range(steps)]
    return Row(name, batch, size, label, family, peak, _predicted(predictor, params), statistics.median(times), times)


def _predicted(predictor: Any, params: int) -> int | None:
    """What the simulator predicts for ours: the executor's plan's peak, the compiled partition's (one
    graph only: the peaks of several graphs of one step do not add up to the step's)."""
    if predictor is None:
        return None
    if isinstance(predictor, Backend):
        return predictor.partitions[0].peak + params if len(predictor.partitions) == 1 else None
    return predictor.plan.peak + params


def _child(args: tuple) -> Row:
    name, batch, size, label, family, how, options, steps = args
    try:
        return measure_one(name, batch, size, label, family, how, options, steps)
    except Exception as e:  # a method that fails is a row saying why; the others still run
        return Row(name, batch, size, label, family, None, None, None, [], status=f"{type(e).__name__}: {str(e)[:160]}")


def run_net(name: str, steps: int, batch: int | None = None, size: int = SIZE,
            methods: list[tuple[str, str, str, dict[str, Any]]] = METHODS) -> list[Row]:
    """Every method of ``methods`` on ``name``, each in a fresh spawned process, one after another."""
    batch = batch_for(name, size) if batch is None else batch
    budget = None
    rows = []
    # mmap every large block: a freed tensor leaves the resident set at once (inherited by the children)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    for label, family, how, options in methods:
        if options.get("budget") == "min_cut":
            budget = min_cut_peak(name, batch, size) if budget is None else budget
            options = {**options, "budget": budget}
        with ctx.Pool(1) as pool:
            row = pool.apply(_child, ((name, batch, size, label, family, how, options, steps),))
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _gib(b: int | None) -> str:
    return "–" if b is None else f"{b / GIB:.3f}"


def _line(r: Row) -> str:
    return (f"{r.network} b{r.batch_size} {r.method}: peak {_gib(r.peak)} GiB (predicted {_gib(r.predicted)}), "
            f"{'–' if r.seconds is None else f'{r.seconds:.2f}'} s, {r.status}")


def table(rows: list[Row]) -> str:
    """Per network: measured peak, predicted peak, step time and its ratio to eager's."""
    out = []
    eager = {r.network: r.seconds for r in rows if r.method == "eager" and r.seconds}
    for r in rows:
        ratio = f"{r.seconds / eager[r.network]:.3f}×" if r.seconds and r.network in eager else "–"
        pred = f"{_gib(r.predicted)} ({r.predicted / r.peak:.3f})" if r.predicted and r.peak else "–"
        out.append([r.network, f"{r.batch_size}×{r.input_size}²", r.method, r.family, _gib(r.peak), pred,
                    "–" if r.seconds is None else f"{r.seconds:.2f}", ratio, r.status])
    return markdown_table(["network", "batch × input", "method", "family", "measured peak GiB (VmHWM)",
                           "predicted GiB (pred / measured)", "step s (median)", "× eager", "status"], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(NETWORKS), choices=nets.names())
    parser.add_argument("--batch", type=POSITIVE_INT, default=None, help="batch for every net (default: the 80%% rule)")
    parser.add_argument("--steps", type=POSITIVE_INT, default=3, help="timed steps per method")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if not has_peak_meter():
        raise SystemExit("benchmarks.ground_truth reads the resident-set peak from /proc/self (Linux); not available here")
    start, commit = time.perf_counter(), head_commit()
    rows = [r for name in args.nets for r in run_net(name, args.steps, args.batch)]
    text = f"{made_by(commit, f'{time.perf_counter() - start:.0f} s', 'one thread')}\n\n{table(rows)}"
    print(text)
    if args.write:
        write_section(REPO / "docs" / "benchmarks.md", "ground-truth", text)


if __name__ == "__main__":
    main()
