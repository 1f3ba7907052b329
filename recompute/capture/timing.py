"""A time model in seconds: per-op costs measured on the device, summed along what runs.

An op's cost depends on what it is and on the shapes it runs on, so the model is a table
:class:`OpKey` → seconds, where the key is the op and the shape, stride and dtype of every tensor it
reads, with its other arguments. A key is measured once, on real tensors of those shapes on the
device (the CPU, or CUDA with synchronisation), as the median of ``repeats`` calls after a warm-up:
the same Python call an executor or an fx module makes. The time of a schedule, an fx module, or
any list of op calls is then the sum of its ops' costs (views and ``getitem`` included: they are
calls too).

An op timed alone is not an op in a step: there it finds some of its inputs in the caches where the
ops before it left them, others long evicted, and its output on memory the allocator just freed.
:meth:`TimeModel.observe` therefore times the ops where they run: a step (a real one, e.g. the plain
step of the program whose plans are priced) runs under :class:`StepTimer`, which times each ATen call it
makes, and a key's cost is its mean call in a step (the median over a few steps). The ops a plan
recomputes are forward ops of that step, so they are priced as the step runs them; keys the step does
not run are timed alone. Ops timed alone with the core's cache flushed mispredict some networks'
steps more than ops timed inside the plain step (``benchmarks/timemodel.py``, docs/simulator.md).

At a size too large to measure op by op in reasonable time (the paper's batches on a CPU),
:class:`BatchExtrapolation` measures the same ops at two small probe batches and extends each op's
cost linearly in the batch to the large one: a fixed part (the call, the weights) and a part that
grows with the batch. The ops of the large step are matched to the probes' by position in
corresponding op sequences (the same program traced at each batch).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._pytree import tree_map

from recompute.core.fxnodes import written_into


__all__ = ["OpKey", "OpCall", "TimeModel", "TimeCache", "BatchExtrapolation", "node_call", "fill", "module_calls", "schedule_calls",
           "Recorder", "StepTimer", "CLOCKS"]


@dataclass(frozen=True)
class TensorSpec:
    """What an op's cost depends on of one tensor argument."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        return cls(tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()), t.dtype, t.device.type)

    def make(self, device: torch.device) -> torch.Tensor:
        """A real tensor of this layout on ``device``: normal values for floats (copied from
        :func:`_normal_pool`), zeros otherwise (valid indices for the index-taking ops)."""
        # the storage the strides span (an expanded tensor has stride 0 and fewer elements than its numel)
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) if all(self.shape) else 0
        base = torch.empty(span, dtype=self.dtype, device=device)
        base = base.copy_(_normal_pool(span, self.dtype, device)) if self.dtype.is_floating_point else base.zero_()
        return base.as_strided(self.shape, self.stride)


_POOLS: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _normal_pool(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``n`` standard normal values of ``dtype`` on ``device``: the start of one pool drawn once per
    :meth:`TimeModel.measure` and grown ×2 when too short (drawing normals costs many times a copy; a
    large step's inputs took a fifth of its timing run to draw)."""
    pool = _POOLS.get((dtype, device))
    if pool is None or pool.numel() < n:
        pool = _POOLS[(dtype, device)] = torch.empty(max(n, 2 * (0 if pool is None else pool.numel())),
                                                     dtype=dtype, device=device).normal_()
    return pool[:n]


@dataclass(frozen=True)
class OpKey:
    """An op and the layout of its arguments: ``op`` its qualified name, ``args`` the arguments with
    every tensor written as its :class:`TensorSpec`."""

    op: str
    args: str


@dataclass
class OpCall:
    """One call of an op: the callable and its arguments, tensors given by their :class:`TensorSpec`."""

    target: Callable[..., Any]
    args: tuple
    kwargs: dict

    @functools.cached_property
    def key(self) -> OpKey:
        # written once per call: a large step's timing run asks a call's key many times
        return OpKey(str(self.target), repr((self.args, sorted(self.kwargs.items()))))

    def materialize(self, device: torch.device) -> tuple[tuple, dict]:
        make = lambda a: a.make(device) if isinstance(a, TensorSpec) else a  # noqa: E731
        return tree_map(make, self.args), tree_map(make, self.kwargs)


def _spec_of(value: Any) -> Any:
    return TensorSpec.of(value) if isinstance(value, torch.Tensor) else value


def node_call(node: fx.Node) -> OpCall | None:
    """The call an fx ``call_function`` node makes, its tensor inputs read off ``meta['val']``
    (``None`` for nodes that call nothing)."""
    if node.op != "call_function":
        return None
    arg = lambda a: _spec_of(a.meta.get("val")) if isinstance(a, fx.Node) else _spec_of(a)  # noqa: E731
    return OpCall(node.target, fx.node.map_aggregate(node.args, arg), dict(fx.node.map_aggregate(node.kwargs, arg)))


def module_calls(gm: fx.GraphModule) -> list[OpCall]:
    """The op calls of an fx module, in order."""
    return [c for n in gm.graph.nodes if (c := node_call(n)) is not None]


def schedule_calls(program: Any, schedule: Any) -> list[OpCall]:
    """The op calls of a :class:`~recompute.pricing.schedule.Schedule` on ``program``'s joint graph: every
    step, recomputations included; a step that writes into an input's storage (``Schedule.into``) as
    the executor runs it (:func:`recompute.core.fxnodes.written_into`), a call that allocates nothing: VGG-19's
    18 ReLUs at 8 × 224² take 0.05 s in place on the CPU and 0.32 s into new tensors."""
    joint = program.joint
    made = _CALLS.setdefault(joint, {})  # each step's call (and its key) built once per joint graph

    def call_of(name: str, into: str | None) -> OpCall | None:
        if (name, into) not in made:
            node = joint.node(name)
            call = node_call(node)
            if call is not None and into is not None:
                op, kwargs = written_into(node.target, call.kwargs, _spec_of(joint.node(into).meta["val"]))
                call = OpCall(op, call.args, kwargs)
            made[name, into] = call
        return made[name, into]

    calls = (call_of(name, schedule.into[i][0] if i in schedule.into else None) for i, (name, _) in enumerate(schedule.steps))
    return [c for c in calls if c is not None]


# joint graph → (fx node name, the name of the node it writes into or None) → its call: the head-to-head
# and recompute.planners.auto price dozens of schedules of one step, and a call's key is its repr
_CALLS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str | None], OpCall | None]]" = weakref.WeakKeyDictionary()


class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every ATen op call made under it (on FakeTensors too) as an :class:`OpCall`: how
    an eager method (``torch.utils.checkpoint``…) is priced without a graph.

    ``device``: the device type the calls' tensors are written with (None: their own). A step run on
    ``meta`` tensors, recorded as ``"cpu"``, has the keys of the same ops traced on the CPU, so that
    one timing prices both: timed apart, minutes apart on a shared host, two steps of the same ops
    came out tens of percent apart (CHANGELOG.md)."""

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.calls: list[OpCall] = []
        self.device = device

    def _spec(self, value: Any) -> Any:
        spec = _spec_of(value)
        if self.device is None:
            return spec
        if isinstance(value, torch.device):  # a factory op's ``device=``
            return torch.device(self.device)
        return replace(spec, device=self.device) if isinstance(spec, TensorSpec) else spec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append(OpCall(func, tree_map(self._spec, args), tree_map(self._spec, kwargs)))
        return func(*args, **kwargs)


class StepTimer(torch.utils._python_dispatch.TorchDispatchMode):
    """Times every ATen call made under it, where it runs (``clock`` read around the call, ``sync`` on
    both sides: ``torch.cuda.synchronize`` on CUDA, so that the kernel is inside): ``seconds[key]`` the
    calls' total and ``calls[key]`` their number. Building a call's key is outside the clock."""

    def __init__(self, clock: Callable[[], float], sync: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.clock, self.sync = clock, sync
        self.seconds: dict[OpKey, float] = collections.defaultdict(float)
        self.calls: collections.Counter[OpKey] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = OpCall(func, tree_map(_spec_of, args), tree_map(_spec_of, kwargs)).key  # before an op that resizes
        self.sync()
        start = self.clock()
        out = func(*args, **kwargs)
        self.sync()
        self.seconds[key] += self.clock() - start
        self.calls[key] += 1
        return out


def _sync(device: torch.device) -> Callable[[], None]:
    """What waits for ``device``'s queued work: CUDA runs kernels beside the CPU thread."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _timed(call: OpCall, device: torch.device, repeats: int, clock: Callable[[], float],
           flush: torch.Tensor | None, enough: float = float("inf"), warm_enough: float = float("inf")) -> float:
    """Median seconds of ``call`` on fresh tensors on ``device`` after one warm-up call, over
    ``repeats`` timed calls or fewer once they add up to ``enough`` seconds; ``flush`` is written
    before every timed call (outside the timing) to evict the inputs from the core's cache. A warm-up
    call that itself takes ``enough`` and ``warm_enough`` is the timing: what a warm-up spares
    (setting up the kernel, first touching the output's pages) is a small part of so long a call."""
    args, kwargs = call.materialize(device)
    sync = _sync(device)

    def once() -> float:
        sync()
        start = clock()
        call.target(*args, **kwargs)
        sync()
        return clock() - start

    with torch.no_grad():
        warm = once()
        if warm >= max(enough, warm_enough):
            return warm
        times: list[float] = []
        while len(times) < repeats and sum(times) < enough:
            if flush is not None:
                flush.add_(1)  # done before the clock starts: once() synchronises first
            times.append(once())
    return statistics.median(times)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def fill(table: dict[OpKey, Any], calls: Iterable[OpCall], measure: Callable[[OpCall], Any], what: str) -> None:
    """``table[key] = measure(call)`` for every key of ``calls`` not in ``table`` yet (each key once);
    an op torch cannot run on made-up values is named, with its key (``what``: the measuring, e.g.
    ``"timing"``). Measuring draws random inputs and runs random ops (dropout): on a fork of the
    generators, so that a step traced inside the caller's training step draws the masks plain training
    would."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        for call in calls:
            key = call.key
            if key not in table:
                try:
                    table[key] = measure(call)
                except Exception as e:
                    raise RuntimeError(f"{what} {key.op} with arguments {key.args} failed: {e}") from e


class TimeCache:
    """Op timings kept on disk, per device: a JSON file ``{op: {args: seconds}}`` under ``directory``
    named after what the timings depend on (the device's name, the torch version, the thread count,
    the clock), so that a process on the same machine reads what an earlier one timed instead of
    timing it again. Written atomically (a whole file replaces the old one); two processes writing at
    once may lose one's new keys, which are then timed again, never half a file.

    :meth:`default` is the cache :func:`recompute.capture.costs.measured_cost` uses: the directory named by
    ``RECOMPUTE_CACHE_DIR`` (empty: no cache), else ``$XDG_CACHE_HOME/recompute`` (``~/.cache/recompute``).
    """

    def __init__(self, directory: str | Path, device: torch.device, clock: str = "wall"):
        self.path = Path(directory) / f"times-{_fingerprint(device, clock)}.json"
        self._loaded: dict[str, dict[str, float]] | None = None

    @classmethod
    def default(cls, device: torch.device, clock: str = "wall") -> "TimeCache | None":
        where = os.environ.get("RECOMPUTE_CACHE_DIR")
        if where is None:
            where = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recompute")
        return cls(where, device, clock) if where else None

    def _table(self) -> dict[str, dict[str, float]]:
        if self._loaded is None:
            try:
                self._loaded = json.loads(self.path.read_text())
            except (OSError, ValueError):  # none yet, or unreadable: timed again, and written anew
                self._loaded = {}
        return self._loaded

    def read(self, keys: Iterable[OpKey]) -> dict[OpKey, float]:
        """The seconds of those ``keys`` the cache holds."""
        table = self._table()
        return {k: table[k.op][k.args] for k in keys if k.args in table.get(k.op, ())}

    def write(self, seconds: dict[OpKey, float]) -> None:
        """Add ``seconds`` to the file (what another process wrote meanwhile is kept); a cache that
        cannot be written is left as it is: the timings stay in the process."""
        if not seconds:
            return
        self._loaded = None
        table = self._table()
        for k, v in seconds.items():
            table.setdefault(k.op, {})[k.args] = v
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(table, f)
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)  # gone once replaced; a failed write's half file otherwise


def _fingerprint(device: torch.device, clock: str) -> str:
    """A short hash of what op timings depend on besides the op: the device, torch, threads, clock."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        with contextlib.suppress(OSError):
            name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("model name")), name)
    what = f"{device.type}|{name}|{torch.__version__}|{torch.get_num_threads()}|{os.cpu_count()}|{clock}"
    return hashlib.blake2b(what.encode(), digest_size=8).hexdigest()


class TimeModel:
    """Seconds per :class:`OpKey`, measured on ``device`` in a step (:meth:`observe`) or alone
(:meth:`measure`); :meth:`seconds` sums a list of calls.

    Attributes:
        device: where the ops are timed.
        repeats: timed calls per key, at most (their median is the cost).
        clock: ``"wall"`` (``time.perf_counter``; the only one on CUDA) or ``"thread"`` (the CPU time of
            the calling thread, ``time.thread_time``: on a shared CPU, what the op costs with the core
            to itself; single-threaded runs only).
        flush_bytes: bytes written between timed calls (0: none). In a step an op reads what earlier
            ops wrote, mostly gone from the core's private cache; timed alone, it would find its inputs
            there. Twice the private (L2) cache evicts them without flushing the shared one.
        lock: held while measuring (None: none). Processes that time ops on one machine, each given
            the same lock, take turns, so that no op is timed while another process streams through
            the shared cache and memory bus (which makes ops slower, unevenly).
        enough: seconds of timed calls after which a key is not timed again, the warm-up call
            counted where it alone takes that long (``inf``: always ``repeats`` calls after it). A call
            of a tenth of a second varies by far less than a microsecond one, and timing it three
            times was most of a paper-scale step's pricing on a CPU.
        warm_enough: seconds a warm-up call must also take to be the timing. A first call pays the
            kernel's set-up, which a training step pays once: oneDNN builds a primitive for each new
            configuration, and VGG-19's first convolution's weight gradient alone at batch 2 (224²)
            took 0.199 s first and 0.073 s after.
        cache: a :class:`TimeCache` the keys timed alone are read from and written to (None: none):
            what this device measured in an earlier process is not timed again.
        table: every key measured so far → seconds.
        observed: the keys of ``table`` timed in a step (:meth:`observe`), not alone.
        spent: wall seconds spent measuring, and waiting for ``lock`` before it (where a run's time goes).
    """

    def __init__(self, device: str | torch.device = "cpu", repeats: int = 5, clock: str = "wall",
                 flush_bytes: int = 0, lock: Any = None, enough: float = float("inf"),
                 warm_enough: float = 1.0, cache: "TimeCache | None" = None):
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        if enough <= 0:
            raise ValueError(f"enough must be positive seconds, got {enough}")
        if clock not in CLOCKS:
            raise ValueError(f"unknown clock {clock!r}; choose one of {', '.join(CLOCKS)}")
        self.device, self.repeats, self.clock, self.enough = torch.device(device), repeats, clock, enough
        self.warm_enough = warm_enough
        self.flush = torch.zeros(flush_bytes // 4, device=self.device) if flush_bytes > 0 else None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("TimeModel(device='cuda') needs a CUDA device; use device='cpu'")
        if self.device.type == "cuda" and clock != "wall":
            raise ValueError("on CUDA only clock='wall' measures the kernels (they run beside the CPU thread)")
        self.cache = cache
        self.table: dict[OpKey, float] = {}
        self.observed: set[OpKey] = set()
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.spent = {"measuring": 0.0, "waiting": 0.0}

    def measure(self, calls: Iterable[OpCall]) -> None:
        """Time every key of ``calls`` not timed yet, on real tensors even where a ``FakeTensorMode`` is
        active (a partitioner runs under AOTAutograd's: there ``torch.empty`` would make FakeTensors,
        and the op's time would be that of propagating their shapes)."""
        missing = [c for c in calls if c.key not in self.table]
        if missing and self.cache is not None:
            self.table.update(self.cache.read(c.key for c in missing))
            missing = [c for c in missing if c.key not in self.table]
        if missing:
            before = set(self.table)
            with self._turn(), unset_fake_temporarily():
                try:
                    fill(self.table, missing, lambda c: _timed(c, self.device, self.repeats, CLOCKS[self.clock],
                                                               self.flush, self.enough, self.warm_enough), "timing")
                finally:
                    _POOLS.clear()  # the values live for one measuring, not beside the steps (a GPU's memory)
            if self.cache is not None:
                self.cache.write({k: self.table[k] for k in self.table.keys() - before})

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """Hold ``lock`` while measuring; the seconds spent waiting for it and measuring go to ``spent``."""
        asked = time.perf_counter()
        with self.lock:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.spent["waiting"] += start - asked
                self.spent["measuring"] += time.perf_counter() - start

    def observe(self, step: Callable[[], Any], steps: int = 3) -> None:
        """Time the ATen calls of ``step()`` where they run: ``steps`` runs, each under a
        :class:`StepTimer`; a key's cost is the median over the runs of its mean call in a run, and
        replaces a cost timed alone. ``step`` is what runs, side effects and all (a training step
        updates what plain training's would: the caller resets gradients or statistics it keeps)."""
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        sync = _sync(self.device)
        means: dict[OpKey, list[float]] = collections.defaultdict(list)
        with self._turn():
            for _ in range(steps):
                timer = StepTimer(CLOCKS[self.clock], sync)
                with timer:
                    step()
                for key, total in timer.seconds.items():
                    means[key].append(total / timer.calls[key])
        for key, seen in means.items():
            self.table[key] = statistics.median(seen)
        self.observed.update(means)

    def costs(self, calls: Sequence[OpCall]) -> list[float]:
        """Each call's seconds (measuring the keys not timed yet)."""
        self.measure(calls)
        return [self.table[c.key] for c in calls]

    def seconds(self, calls: Sequence[OpCall]) -> float:
        """The predicted time of running ``calls`` one after another: the sum of their costs."""
        return float(sum(self.costs(calls)))


class BatchExtrapolation:
    """Seconds of op calls at a large batch from costs measured at two probe batches.

    :meth:`add` registers corresponding op sequences (the same program at the probe batches
    ``small`` < ``large`` and at the ``target`` batch); each target key's cost is then
    ``t(small) + (t(large) − t(small)) · (target − small) / (large − small)``, never less than
    ``t(small)`` (noise must not make an op cheaper at a larger batch). At ``small == large ==
    target`` nothing is extended: the ops are timed at the target batch itself.

    An op whose call at the small probe takes ``proportional`` seconds or more is not timed at the
    large one: it is extended in proportion to the batch, ``t(small) · target / small`` (what the
    formula above gives an op with no fixed part). A call that long is arithmetic over the batch, and
    timing it again at the larger probe was most of a head-to-head's timing (U-Net's convolutions at
    572², seconds each).
    """

    def __init__(self, model: TimeModel, small: int, large: int, target: int, proportional: float = float("inf")):
        if not (0 < small < large or 0 < small == large == target):
            raise ValueError(f"probe batches must satisfy 0 < small < large (or both be the target batch), got {small} and {large}")
        if not proportional > 0:
            raise ValueError(f"proportional must be a positive number of seconds, got {proportional!r}")
        self.model, self.small, self.large, self.target = model, small, large, target
        self.proportional = proportional
        self.probes: dict[OpKey, tuple[OpCall, OpCall]] = {}

    def add(self, small: Sequence[OpCall], large: Sequence[OpCall], target: Sequence[OpCall]) -> None:
        """Match the calls of one program at the three batches, position by position."""
        if not len(small) == len(large) == len(target):
            raise ValueError(f"the probes do not correspond: {len(small)}, {len(large)} and {len(target)} op calls")
        for s, l, t in zip(small, large, target):
            if not str(s.target) == str(l.target) == str(t.target):
                raise ValueError(f"the probes do not correspond: {s.target} / {l.target} / {t.target} at one position")
            self.probes.setdefault(t.key, (s, l))

    def probe(self, target: Sequence[OpCall], at: Callable[[int], Sequence[OpCall]]) -> Sequence[OpCall]:
        """``target`` (a program's calls at the target batch), with the same program's calls at the probe
        batches (``at(batch)``) added only where a key of ``target`` has no probe yet: making them means
        tracing or running the step again."""
        if self.missing(target):
            self.add(*(target if b == self.target else at(b) for b in (self.small, self.large)), target)
        return target

    def missing(self, calls: Iterable[OpCall]) -> list[OpKey]:
        """The keys of ``calls`` no probe matches."""
        return [c.key for c in calls if c.key not in self.probes]

    def costs(self, calls: Sequence[OpCall]) -> list[float]:
        missing = self.missing(calls)
        if missing:
            raise KeyError(f"{len(missing)} op calls have no probe, e.g. {missing[0].op} {missing[0].args[:200]}; "
                           "add() the same program traced at the probe batches")
        pairs = [self.probes[c.key] for c in calls]
        table = self.model.table
        self.model.measure(s for s, _ in pairs)
        self.model.measure(l for s, l in pairs if table[s.key] < self.proportional)
        slope = (self.target - self.small) / (self.large - self.small) if self.large > self.small else 0.0
        out = []
        for s, l in pairs:
            ts = table[s.key]
            if ts >= self.proportional and self.large > self.small:
                out.append(ts * self.target / self.small)
            else:
                out.append(ts + max(table[l.key] - ts, 0.0) * slope)
        return out

    def seconds(self, calls: Sequence[OpCall]) -> float:
        return float(sum(self.costs(calls)))
