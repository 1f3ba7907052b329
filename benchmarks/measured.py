"""The measured head-to-head: PyTorch's methods and ours as real training steps on this CPU.

    python -m benchmarks.measured                        # every network; print the tables
    python -m benchmarks.measured --write                # and paper_figures/measured.json, measured_<net>.png,
                                                         # the table in docs/pytorch.md
    python -m benchmarks.measured --nets resnet50 gpt2   # some networks (the others' records are kept)

Every method trains the same network, from the same weights, as a user runs it: eager PyTorch;
``checkpoint`` per block; ``checkpoint_sequential`` (2, ⌈√n⌉, 8 segments); selective activation
checkpointing per block with the compute-intensive ops saved and with ``aten.mm`` saved (the policy of
``torch.utils.checkpoint``'s documentation); ``torch.compile`` (inductor) at ``activation_memory_budget``
1, 0.5, 0.3, 0.1 and with ``aggressive_recomputation``; ours by default (``recompute.optimize(model,
inputs)``, nothing else), ours through ``recompute.backend()`` compiled by inductor, and ours with
the paper's planner and each rewrite named. The networks are :data:`SIZES`: the paper's seven,
torchvision's ViT-B/16 and MobileNetV3-Large and a GPT-2-style decoder, each at a batch and input size
where activations, not the parameter gradients, make most of plain training's peak and a step takes
seconds on this CPU (the reason is stated per network).

Per network, each method's first step compiles or plans (timed apart: ``setup_seconds``) and is
compared with plain training's step from the same state (:func:`recompute.doors.exactness.judge`:
``bitwise``, ``close`` within float32 rounding, or what differs); its second runs under the CPU
allocator's meter (:class:`recompute.capture.allocator.AllocatorMeter`: the profiler's memory events, which
see what inductor's compiled code and the ops' own scratch allocate), the peak above what existed
before the step (parameters excluded; ``peak_with_params`` adds the parameters and buffers). Then
``--steps`` rounds time one step of every method each, in an order that rotates from round to round,
so that drift on the host reaches all methods alike; a method's time is its median, its spread the
largest minus the smallest. Networks run one after another on every core (``--jobs 1``): a network
compiling beside another's timed steps made them up to 1.7× slower, unevenly.

Verdicts (:func:`verdict`), read as a user reads them: PyTorch's smallest measured peak among its
methods whose median is within ``FAST`` × eager's, and ours by default — then the best of ours with
flags — at no more than that point's median plus its spread. A peak ratio counts as a win at ≤
:data:`BAR`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

import recompute
from experiments import nets
from recompute.capture.allocator import AllocatorMeter
from recompute.doors.baselines import Unsupported
from recompute.doors.exactness import judge, train_step
from recompute.doors.measure import interleaved, training_step

from .common import POSITIVE_INT, REPO, head_commit, made_by, markdown_table, write_atomic, write_doc

FAST = 1.3  # PyTorch's points compared: those within this × eager's measured time
BAR = 0.8  # ours' peak ÷ PyTorch's smallest within FAST: a win at or below
FIGURES = REPO / "paper_figures"
RECORDS = FIGURES / "measured.json"
MIB = 2**20


@dataclass(frozen=True)
class Size:
    """A network's batch and input size in this benchmark, and why."""

    batch: int
    input_size: int
    why: str


SIZES: dict[str, Size] = {  # shares: what is not parameter gradients of eager's peak (fake backend)
    "resnet50": Size(8, 160, "activations 75% of eager's peak (parameter gradients 97 MiB)"),
    "resnet152": Size(12, 112, "230 MiB of parameter gradients; at batch 12, 112² activations are 59% of eager's peak"),
    "vgg19": Size(16, 224, "548 MiB of parameter gradients: at batch 8, 192² they were the floor (every compiled "
                           "method held 557 MiB, ours by default with gradients made last 548 simulated); at batch "
                           "16, 224² activations are 68% of plain training's simulated peak, a step ~13 s on two cores"),
    "densenet161": Size(8, 128, "activations 82% of eager's peak"),
    "googlenet": Size(16, 128, "activations 90% of eager's peak; under a second a step"),
    "unet": Size(4, 128, "120 MiB of parameter gradients; activations 52% of eager's peak (572² maps make a step slow)"),
    "pspnet": Size(2, 160, "187 MiB of parameter gradients; activations 53% of eager's peak (a dilated ResNet-101 "
                           "at 1/8 resolution is slow)"),
    "vit_b_16": Size(24, 128, "330 MiB of parameter gradients (at batch 8 they were the whole peak); 65 tokens a "
                              "sequence at 128², activations 64% of eager's peak"),
    "mobilenet_v3_large": Size(32, 128, "activations 95% of eager's peak"),
    "gpt2": Size(4, 256, "a 6 × 384 decoder over 256 tokens: activations 88% of eager's peak"),
}


Runner = Callable[..., Any]


@dataclass(frozen=True)
class Method:
    """One way to train: its label, family (``ours``/``pytorch``), whether it is what a user gets
    without flags (ours by default, and every PyTorch method as its users call it), whether it runs
    compiled code, and ``build(model, inputs)`` → what a training step calls."""

    label: str
    family: str
    default: bool
    compiled: bool
    build: Callable[[nn.Module, tuple], Runner]


def _baseline(method: str, **options: Any) -> Callable[[nn.Module, tuple], Runner]:
    return lambda model, inputs: recompute.optimize(model, method=method, **options)


def _ours(**options: Any) -> Callable[[nn.Module, tuple], Runner]:
    return lambda model, inputs: recompute.optimize(model, inputs, **options)


def _ours_compiled(model: nn.Module, inputs: tuple) -> Runner:
    return torch.compile(model, backend=recompute.backend(runtime="inductor"))


MC = {"method": "approxdp", "strategy": "mc"}
METHODS: tuple[Method, ...] = (
    Method("eager", "pytorch", True, False, lambda model, inputs: model),
    Method("checkpoint per block", "pytorch", True, False, _baseline("torch_checkpoint_blocks")),
    Method("checkpoint_sequential 2", "pytorch", True, False, _baseline("torch_checkpoint_sequential", segments=2)),
    Method("checkpoint_sequential √n", "pytorch", True, False, _baseline("torch_checkpoint_sequential", segments=0)),
    Method("checkpoint_sequential 8", "pytorch", True, False, _baseline("torch_checkpoint_sequential", segments=8)),
    Method("SAC per block, compute-intensive saved", "pytorch", True, False,
           _baseline("torch_sac", policy="compute_intensive")),
    Method("SAC per block, mm saved", "pytorch", True, False, _baseline("torch_sac", policy="matmul")),
    *(Method(f"compile budget {b:g}", "pytorch", True, True, _baseline("torch_compile_budget", budget_fraction=b))
      for b in (1.0, 0.5, 0.3, 0.1)),
    Method("compile aggressive recomputation", "pytorch", True, True,
           _baseline("torch_compile_budget", budget_fraction=1.0, aggressive=True)),
    Method("ours", "ours", True, False, _ours()),
    Method("ours, max_time=1.1", "ours", False, False, _ours(max_time=1.1)),
    Method("ours through backend, inductor", "ours", False, True, _ours_compiled),
    Method("approxdp-tc (paper)", "ours", False, False, _ours(method="approxdp", strategy="tc")),
    Method("approxdp-mc (paper)", "ours", False, False, _ours(**MC)),
    Method("approxdp-mc +in-place", "ours", False, False, _ours(**MC, in_place=True)),
    Method("approxdp-mc +late+in-place", "ours", False, False, _ours(**MC, recompute_late=True, in_place=True)),
    Method("approxdp-mc +peak+in-place", "ours", False, False, _ours(**MC, recompute_at_peak=True, in_place=True)),
    Method("approxdp-mc +split conv+peak+in-place", "ours", False, False,
           _ours(**MC, split_convolutions=True, recompute_at_peak=True, in_place=True)),
)


@dataclass
class Point:
    """One method's measured steps on one network (a record of ``paper_figures/measured.json``).

    Attributes:
        peak: bytes the step allocated at its peak above what existed before it (parameters excluded;
            parameter gradients, activations, temporaries, compiled buffers and ops' scratch included).
        peak_with_params: ``peak`` plus the parameters and buffers.
        seconds: the median of ``steps`` timed steps; ``seconds_spread`` their largest minus smallest.
        times: every timed step, seconds.
        exact: ``bitwise``, ``close`` (within float32 rounding), what differs, or None where not run.
        setup_seconds: the first step's time (compiling or planning included).
        status: ``ok``, or why the method did not run on this network.
    """

    network: str
    batch_size: int
    input_size: int
    method: str
    family: str
    default: bool
    compiled: bool
    peak: int | None = None
    peak_with_params: int | None = None
    seconds: float | None = None
    seconds_spread: float | None = None
    steps: int = 0
    exact: str | None = None
    device: str = ""
    commit: str = ""
    times: list[float] = field(default_factory=list)
    setup_seconds: float | None = None
    status: str = "ok"


def _device_name() -> str:
    """The CPU this ran on and the threads it used."""
    name = "CPU"
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {torch.get_num_threads()} threads"


def _compile_settings(jobs: int) -> None:
    """Room for one compiled graph per method of a network; with several jobs, inductor's C++ built in
    the job's own process (its core, not the other job's). Inductor's caches stay on: their keys hold
    ``activation_memory_budget`` (a second process finds each budget's own graph), and what made every
    budget run the first one's graph was dynamo's reuse within the process, which each compiled method's
    own backend prevents (:func:`recompute.doors.baselines.torch_compile_budget`). A second run compiles in
    seconds what the first took minutes over."""
    import torch._dynamo.config
    import torch._inductor.config

    if jobs > 1:
        torch._inductor.config.compile_threads = 1
    torch._dynamo.config.cache_size_limit = 64


def _twin(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters are ``model``'s (its modules and buffers its own): a method
    that changes modules (PyTorch's checkpointing turns in-place ReLUs out of place) changes only its
    twin, and twenty methods of VGG-19 do not hold twenty copies of its weights."""
    return copy.deepcopy(model, memo={id(p): p for p in model.parameters()})


def _why(e: BaseException) -> str:
    """A failure in one line: its type and, for a wrapped one (dynamo's BackendCompilerFailed: its first
    line is only 'backend=... raised:'), the innermost cause's."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [line for line in str(root).splitlines() if line.strip()] or [""]
    head = type(e).__name__ + (f" from {type(root).__name__}" if root is not e else "")
    return f"{head}: {lines[0][:300]}"


def run_net(name: str, steps: int, methods: Sequence[Method] = METHODS, commit: str = "",
            progress: Callable[[str], None] = print, lock: Any = None) -> list[Point]:
    """Every method of ``methods`` on network ``name`` at its :data:`SIZES` (see the module docstring).
    ``lock``: held while the steps are timed, so that networks run side by side (``--jobs``) compile
    and plan while another is timed, never time at once."""
    size = SIZES[name]
    model, inputs = nets.build(name, batch_size=size.batch, input_size=size.input_size, seed=0)
    params = list(model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in [*params, *model.buffers()])
    device = _device_name()
    start = {n: b.clone() for n, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[]):
        reference = {k: v.detach().clone() for k, v in train_step(model, model, inputs, seed=0).items()}
    model.zero_grad(set_to_none=True)
    points, runners = [], []
    for m in methods:
        point = Point(name, size.batch, size.input_size, m.label, m.family, m.default, m.compiled, device=device,
                      commit=commit)
        points.append(point)
        twin = _twin(model)
        t0 = time.perf_counter()
        try:
            runner = m.build(twin, inputs)
            with torch.no_grad():
                for n, b in twin.named_buffers():
                    b.copy_(start[n])
            with torch.random.fork_rng(devices=[]):  # the first step compiles or plans, and is compared
                got = train_step(twin, runner, inputs, seed=0)
            point.exact = judge(reference, got).summary()
            del got
            for p in params:
                p.grad = None
        except (Unsupported, NotImplementedError, RuntimeError, ValueError, TypeError) as e:
            point.status = _why(e)
            progress(f"{name} {m.label}: not run ({point.status})")
            continue
        point.setup_seconds = time.perf_counter() - t0
        gc.collect()
        with AllocatorMeter() as meter:
            training_step(runner, params, inputs)
        point.peak, point.peak_with_params = meter.peak, meter.peak + state_bytes
        runners.append((point, runner))
        progress(f"{name} {m.label}: peak {meter.peak / MIB:.1f} MiB, first step {point.setup_seconds:.1f} s, {point.exact}")
    with lock if lock is not None else contextlib.nullcontext():
        times = interleaved({point.method: functools.partial(training_step, runner, params, inputs)
                             for point, runner in runners}, steps)
    for point, _ in runners:
        point.times = times[point.method]
        point.steps = len(point.times)
        point.seconds = statistics.median(point.times)
        point.seconds_spread = max(point.times) - min(point.times)
    return points


@dataclass
class Verdict:
    """One network read as a user reads it (see the module docstring).

    Attributes:
        eager: plain training's point; ``bar``: PyTorch's smallest peak within ``FAST`` × its time.
        default: ours by default; ``best``: the least peak of ours within the bar's time plus spread.
        default_ratio, best_ratio: their peaks ÷ the bar's (None where the point is slower than that).
    """

    network: str
    eager: Point
    bar: Point
    default: Point
    best: Point | None
    default_ratio: float | None
    best_ratio: float | None

    @property
    def wins(self) -> bool:
        return self.default_ratio is not None and self.default_ratio <= BAR


def verdict(points: Sequence[Point]) -> Verdict:
    """The verdict of one network's points (all measured: status ``ok``)."""
    ran = [p for p in points if p.status == "ok"]
    eager = next(p for p in ran if p.method == "eager")
    fast = [p for p in ran if p.family == "pytorch" and p.seconds <= FAST * eager.seconds]
    bar = min(fast, key=lambda p: (p.peak, p.seconds))
    limit = bar.seconds + bar.seconds_spread
    default = next(p for p in ran if p.family == "ours" and p.default)
    within = [p for p in ran if p.family == "ours" and p.seconds <= limit]
    best = min(within, key=lambda p: (p.peak, p.seconds), default=None)
    return Verdict(eager.network, eager, bar, default, best,
                   default.peak / bar.peak if default.seconds <= limit else None,
                   best.peak / bar.peak if best is not None else None)


def table(points: Sequence[Point]) -> str:
    """Every point of one network: peak, peak with parameters, time (median ± spread, × eager's), exactness."""
    eager = next((p for p in points if p.method == "eager" and p.status == "ok"), None)
    rows = []
    for p in points:
        if p.status != "ok":
            rows.append([p.method, p.family, "–", "–", "–", "–", p.status])
            continue
        ratio = f"{p.seconds / eager.seconds:.2f}×" if eager else "–"
        rows.append([p.method + (" (default)" if p.family == "ours" and p.default else ""), p.family,
                     f"{p.peak / MIB:.1f}", f"{p.peak_with_params / MIB:.1f}",
                     f"{p.seconds:.3f} ± {p.seconds_spread:.3f}", ratio, p.exact])
    return markdown_table(["method", "family", "peak MiB", "with params MiB", "step s (median ± spread)",
                           "× eager", "vs plain training"], rows)


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """One row per network: the bar, ours by default and the best of ours at its time."""
    def ours(p: Point | None, ratio: float | None) -> str:
        if p is None:
            return "none at that time"
        shown = f"{p.peak / MIB:.1f} MiB at {p.seconds / p_eager(p):.2f}×"
        return f"{shown}: **{ratio:.2f}×**" if ratio is not None else f"{shown}: slower than the bar"

    def p_eager(p: Point) -> float:
        return next(v.eager.seconds for v in verdicts if v.network == p.network)

    rows = [[v.network, f"{v.bar.method}: {v.bar.peak / MIB:.1f} MiB at {v.bar.seconds / v.eager.seconds:.2f}× "
             f"(± {v.bar.seconds_spread / v.eager.seconds:.2f})",
             ours(v.default, v.default_ratio), f"{v.best.method}: {ours(v.best, v.best_ratio)}" if v.best else "–",
             "yes" if v.wins else "no"] for v in verdicts]
    return markdown_table(["network", f"PyTorch's smallest within {FAST}× eager", "ours by default",
                           "ours, best with flags, at ≤ the bar's time", f"default ≤ {BAR}×"], rows)


def figure(points: Sequence[Point], path: Path) -> None:
    """Peak against step time (× eager's) for one network: PyTorch's points, ours, the default marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [p for p in points if p.status == "ok"]
    eager = next(p for p in ran if p.method == "eager")
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for family, color, marker in (("pytorch", "tab:blue", "o"), ("ours", "tab:orange", "s")):
        ps = [p for p in ran if p.family == family]
        ax.errorbar([p.seconds / eager.seconds for p in ps], [p.peak / MIB for p in ps],
                    xerr=[[(p.seconds - min(p.times)) / eager.seconds for p in ps],
                          [(max(p.times) - p.seconds) / eager.seconds for p in ps]],
                    fmt=marker, color=color, label="PyTorch" if family == "pytorch" else "ours", capsize=2)
        for p in ps:
            ax.annotate(p.method, (p.seconds / eager.seconds, p.peak / MIB), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")
    default = next(p for p in ran if p.family == "ours" and p.default)
    ax.plot([default.seconds / eager.seconds], [default.peak / MIB], "*", color="red", markersize=16,
            label="ours by default")
    ax.axvline(FAST, color="gray", linestyle=":", linewidth=1)
    ax.set_xlabel("step time ÷ eager's (median; bars: min–max)")
    ax.set_ylabel("peak MiB (parameters excluded)")
    ax.set_title(f"{eager.network}, batch {eager.batch_size}, {eager.input_size}: measured on the CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def load() -> list[Point]:
    """The records in ``paper_figures/measured.json`` (none before the first ``--write``)."""
    if not RECORDS.exists():
        return []
    return [Point(**r) for r in json.loads(RECORDS.read_text())]


def save(points: Sequence[Point]) -> None:
    write_atomic(RECORDS, lambda tmp: Path(tmp).write_text(json.dumps([asdict(p) for p in points], indent=1)))


def summary(points: Sequence[Point], header: str) -> str:
    """What made the records, then the verdicts: ``paper_figures/measured.md``, which the README includes."""
    by_net = [[p for p in points if p.network == n] for n in SIZES if any(p.network == n for p in points)]
    verdicts = [verdict(ps) for ps in by_net]
    wins = sum(v.wins for v in verdicts)
    return "\n".join([header, "", f"Ours by default is at most {BAR}× PyTorch's smallest peak within {FAST}× eager's "
                      f"time, at no more than that point's time plus its spread, on **{wins} of {len(verdicts)}** "
                      "networks.", "", verdict_table(verdicts), ""])


def report(points: Sequence[Point], header: str) -> str:
    """The docs section: :func:`summary`, then every network's table."""
    parts = [summary(points, header)]
    for n in SIZES:
        ps = [p for p in points if p.network == n]
        if ps:
            size, made = SIZES[n], ps[0]
            why = size.why if (made.batch_size, made.input_size) == (size.batch, size.input_size) else (
                f"recorded before this network's size became batch {size.batch}, {size.input_size}")
            parts += [f"**{n}**, batch {made.batch_size}, {made.input_size} ({why}); {made.device}, commit "
                      f"{made.commit}:", "", table(ps), "", f"![{n}](../paper_figures/measured_{n}.png)", ""]
    return "\n".join(parts).rstrip("\n")


def write_report(points: Sequence[Point], header: str) -> None:
    """docs/pytorch.md's section and ``paper_figures/measured.md``."""
    write_doc("measured", report(points, header))
    write_atomic(FIGURES / "measured.md", lambda tmp: Path(tmp).write_text(summary(points, header)))


_LOCK: Any = None


def _child(lock: Any, threads: int, jobs: int) -> None:
    """A job's process: the timing lock it shares, its threads, inductor's settings."""
    global _LOCK
    _LOCK = lock
    torch.set_num_threads(threads)
    _compile_settings(jobs)


def _run(name: str, steps: int, commit: str) -> tuple[str, list[Point], float]:
    start = time.perf_counter()
    points = run_net(name, steps, commit=commit, progress=lambda line: print(line, flush=True), lock=_LOCK)
    return name, points, time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--steps", type=POSITIVE_INT, default=5, help="timed rounds (each method one step a round)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=1,
                        help="networks at once (the cores shared among them): one compiles while another is timed, "
                             "beside it")
    parser.add_argument("--write", action="store_true",
                        help="update paper_figures/measured.json, measured_<net>.png and docs/pytorch.md")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: write docs/pytorch.md's section and the figures from the stored records")
    args = parser.parse_args(argv)
    if args.render:
        points = load()
        for name in {p.network for p in points}:
            figure([p for p in points if p.network == name], FIGURES / f"measured_{name}.png")
        write_report(points, "Rendered " + made_by(head_commit(), "from the stored records, each network's naming "
                                                    "its commit", argv=argv))
        return
    commit = head_commit()
    header = "Measured " + made_by(commit, f"networks {', '.join(args.nets)} made now; the others' records name their "
                                   "commit", argv=argv)
    kept = [p for p in load() if p.network not in args.nets] if args.write else []
    context = multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    with context.Manager() as manager, ProcessPoolExecutor(args.jobs, mp_context=context, initializer=_child,
                                                          initargs=(manager.Lock(), threads, args.jobs)) as pool:
        for future in as_completed([pool.submit(_run, name, args.steps, commit) for name in args.nets]):
            name, points, seconds = future.result()
            print(f"{name}: {seconds:.0f} s\n{table(points)}\n", flush=True)
            if args.write:  # each network as it is done: a stopped run keeps what it measured
                kept = [p for p in kept if p.network != name] + points
                save(kept)
                figure(points, FIGURES / f"measured_{name}.png")
                write_report(kept, header)


if __name__ == "__main__":
    main()
