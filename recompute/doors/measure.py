"""Measurement of one training step: peak memory and time, behind one interface, three backends.

* ``cuda`` — ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, synchronised
  wall time; what the caching allocator really hands out.
* ``cpu`` — real execution; the peak is the CPU allocator's (:class:`~recompute.capture.allocator.AllocatorMeter`:
  the profiler's memory events, which see what ops allocate inside themselves and what code inductor
  compiled allocates). The peak of live tensor storages is also tracked (``storage_peak_bytes``), by a
  ``TorchDispatchMode`` that registers every storage an op creates and releases it when the storage
  dies, so that it does not depend on any allocator. Wall time per iteration, of steps run without
  either meter; each peak comes from one more step under its meter.
* ``fake`` — the same step under ``FakeTensorMode``: the storage peak at paper scale in seconds, with
  no arithmetic (and no time figure, and no op's internal scratch: no kernel runs).

The peak counts what the step allocates (activations, gradients, temporaries); parameters and the
inputs exist before the step and are reported apart (``param_bytes``). The ``cpu`` and ``fake`` meters
also give the peak without the parameter gradients (``activation_peak_bytes``), which at small inputs
can outweigh the activations a plan saves.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from recompute.capture.allocator import AllocatorMeter
from recompute.core.storage import tensor_bytes
from recompute.doors.execute import module_state

__all__ = ["Measurement", "MemoryMeter", "measure", "interleaved", "training_step", "BACKENDS", "default_loss"]

BACKENDS = ("cuda", "cpu", "fake")


@dataclass
class Measurement:
    """Peak memory and time of a training step (forward, loss, backward).

    Attributes:
        backend: ``cuda``, ``cpu`` or ``fake``.
        peak_bytes: peak bytes allocated by the step above what existed before it (activations,
            gradients and temporaries): the allocator's on ``cuda`` and ``cpu`` (ops' internal
            workspaces included), the storages' on ``fake``.
        storage_peak_bytes: the peak of live tensor storages (``cpu``, ``fake``; what the simulator
            prices without workspaces), ``None`` on ``cuda``.
        param_bytes: bytes of the parameters and buffers (add them for a total like the paper's).
        grad_bytes: bytes of the parameter gradients at the end of the step.
        activation_peak_bytes: the peak had the storages that end the step as parameter gradients never
            been allocated: activations and temporaries (``None`` on ``cuda``, whose allocator
            cannot tell them apart).
        seconds: median wall time of one step (``None`` on ``fake``).
        times: every timed iteration, seconds.
        predicted_peak: the plan's predicted peak (the simulator's, on a traced graph), when a plan
            was measured.
    """

    backend: str
    peak_bytes: int
    param_bytes: int
    grad_bytes: int
    activation_peak_bytes: int | None = None
    storage_peak_bytes: int | None = None
    seconds: float | None = None
    times: list[float] = field(default_factory=list)
    predicted_peak: int | None = None

    @property
    def total_peak_bytes(self) -> int:
        """Peak including parameters, comparable with the paper's Table 1."""
        return self.peak_bytes + self.param_bytes


class MemoryMeter(TorchDispatchMode):
    """Counts the bytes of live tensor storages created under it; ``peak`` is the high-water mark.

    A storage is alive while anything but the meter holds it: the meter keeps one reference to
    each storage it saw created and, before every op, releases those whose C++ use count has fallen
    to that one reference. (Python storage objects may die before the storage itself, e.g. while
    autograd still holds a saved tensor, so their lifetime cannot be used.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, tuple[torch.UntypedStorage, int]] = {}
        # (storage key, +bytes when counted / −bytes when released), in order: replayed by peak_without
        self._events: list[tuple[int, int]] = []

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """True: torch.compile compiles under the meter with the meter off and meters the compiled code
        as it runs; under any other mode Dynamo does not compile, and a compiled module runs eagerly."""
        return True

    def sweep(self) -> None:
        """Release the storages nothing but the meter refers to any more."""
        dead = [key for key in self._storages if torch._C._storage_Use_Count(key) == 1]
        for key in dead:
            nbytes = self._storages.pop(key)[1]
            self.live -= nbytes
            self._events.append((key, -nbytes))

    def peak_without(self, tensors: Iterable[torch.Tensor]) -> int:
        """The peak had the storages of ``tensors``, live now, never been counted (parameter gradients)."""
        skip = {t.untyped_storage()._cdata for t in tensors} & self._storages.keys()
        # a key can also name an earlier storage at the same address: only its last counting is the live one
        births = {key: i for i, (key, nbytes) in enumerate(self._events) if nbytes > 0 and key in skip}
        skipped = set(births.values())
        live = peak = 0
        for i, (_, nbytes) in enumerate(self._events):
            if i not in skipped:
                live += nbytes
                peak = max(peak, live)
        return peak

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Storages that exist before the step (parameters, buffers, inputs): seen, never counted."""
        for t in tensors:
            storage = t.untyped_storage()
            self._storages.setdefault(storage._cdata, (storage, 0))

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self._storages:
            nbytes = storage.nbytes()
            self._storages[key] = (storage, nbytes)
            self._events.append((key, nbytes))
            self.live += nbytes
            self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.sweep()
        out = func(*args, **(kwargs or {}))
        mask = _output_mask(func, args, kwargs or {})
        if mask is not None and isinstance(out, tuple) and len(out) == len(mask):
            # the device kernels leave an output the mask turns off undefined (None); FakeTensorMode's
            # make it anyway (native_batch_norm_backward's grad_input), a tensor the step never holds
            out = tuple(o if on else None for o, on in zip(out, mask))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self.track(t)
        return out

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.sweep()
        self._storages.clear()


def _output_mask(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Sequence[bool] | None:
    """The ``output_mask`` argument of an op that takes one (the backward ops: which gradients to make)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "output_mask":
            return kwargs["output_mask"] if "output_mask" in kwargs else args[i] if i < len(args) else None
    return None


def default_loss(out: Any) -> torch.Tensor:
    """A scalar that depends on every output element (mean of squares, in float32)."""
    return sum(t.float().square().mean() for t in tree_leaves(out) if isinstance(t, torch.Tensor))


Step = Callable[..., Any]


def _each_once(tensors: Iterable[Any]) -> list[Any]:
    """``tensors`` without repeats (a tied parameter is listed under every name it has)."""
    return list({id(t): t for t in tensors}.values())


def _fake_state(model: torch.nn.Module, mode: FakeTensorMode) -> dict[str, torch.Tensor]:
    """A FakeTensor for each of the model's tensors, one per tensor: a parameter shared by two modules
    (tied embeddings) is one fake leaf under both names, as it is one tensor under both."""
    out: dict[str, torch.Tensor] = {}
    fakes: dict[int, torch.Tensor] = {}
    for name, t in module_state(model).items():
        if id(t) not in fakes:
            fake = mode.from_tensor(t)
            fakes[id(t)] = fake.detach().requires_grad_(t.requires_grad) if t.requires_grad else fake
        out[name] = fakes[id(t)]
    return out


class _Step(torch.nn.Module):
    """A whole training step as a module's forward, so that ``functional_call`` swaps ``model``'s
    tensors for the forward and backward passes alike."""

    def __init__(self, model: torch.nn.Module, step: Callable[[], None]):
        super().__init__()
        self.model, self.step = model, step

    def forward(self) -> None:
        self.step()


def _prefixed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"model.{k}": v for k, v in state.items()}


def measure(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    *,
    runner: Callable[..., Any] | None = None,
    backend: str = "cpu",
    iterations: int = 3,
    warmup: int = 1,
    loss_fn: Callable[[Any], torch.Tensor] = default_loss,
    predicted_peak: int | None = None,
) -> Measurement:
    """Measure training steps of ``runner`` (default: ``model`` itself, i.e. vanilla training).

    ``runner(*inputs, state=...)`` is how an :class:`~recompute.doors.execute.Executor` is called; a plain
    module is called as ``torch.func.functional_call(model, state, inputs)``; a module runner wrapping
    ``model`` (a :class:`~recompute.doors.baselines.BaselineModule`) as ``runner(*inputs)``, its step under
    ``functional_call`` where the state is not the model's own. A runner with ``check_backend``
    raises :class:`~recompute.doors.baselines.UnsupportedBackend` for a backend that cannot run it. Each step runs the
    forward pass, ``loss_fn`` and ``backward()`` and then drops the gradients, so steps are alike.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if hasattr(runner, "check_backend"):
        runner.check_backend(backend)
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    params = module_state(model)
    param_bytes = tensor_bytes(list(params.values()))

    def call(state: dict[str, torch.Tensor], xs: tuple) -> Any:
        if runner is None:  # plain training: the model itself, on another state only for the fake backend
            return model(*xs) if state is params else torch.func.functional_call(model, state, xs)
        if isinstance(runner, torch.nn.Module):
            return runner(*xs)  # on the model's own tensors (the other case is in one_step)
        return runner(*xs, state=state)

    # an executor traced with the loss (``trace(..., loss_fn=...)``) returns the loss itself
    step_loss = (lambda out: out) if getattr(runner, "includes_loss", False) else loss_fn

    def one_step(state: dict[str, torch.Tensor], xs: tuple) -> list[torch.Tensor]:
        """One step; the parameter gradients it left (:func:`drop` them, so that steps are alike)."""
        if state is not params and (runner is None or isinstance(runner, torch.nn.Module)):
            # the model itself, or a module runner (a baseline), may read the model's tensors again when it
            # recomputes in backward (PyTorch's checkpointing: its own, or a Hugging Face model's after
            # gradient_checkpointing_enable()): the other state (the fake backend's) replaces them for the
            # whole step, not for the forward call alone
            forward = model if runner is None else runner
            torch.func.functional_call(_Step(model, lambda: step_loss(forward(*xs)).backward()), _prefixed(state), ())
        else:
            step_loss(call(state, xs)).backward()
        return [t.grad for t in _each_once(state.values()) if isinstance(t, torch.Tensor) and t.grad is not None]

    def drop(state: dict[str, torch.Tensor]) -> None:
        for t in state.values():
            t.grad = None

    def metered_step(state: dict[str, torch.Tensor], xs: tuple) -> tuple[MemoryMeter, int, int]:
        """One step under the meter: the meter, the peak without the parameter gradients, their bytes."""
        meter = MemoryMeter()
        meter.exclude([*state.values(), *xs])
        with meter:
            grads = one_step(state, xs)
            activations, grad_bytes = meter.peak_without(grads), tensor_bytes(grads)
            del grads
            drop(state)
        return meter, activations, grad_bytes

    if backend == "fake":
        mode = FakeTensorMode(allow_non_fake_inputs=False)
        state = _fake_state(model, mode)
        xs = tuple(mode.from_tensor(x) for x in inputs)
        with mode:
            if isinstance(runner, torch.nn.Module) and warmup > 0:
                # a module runner's first call may do one-off work (an optimized module traces and plans
                # at new shapes): outside the meter, which counted it as the step's (13.7 kB for 4.5)
                one_step(state, xs)
                drop(state)
            meter, activations, grad_bytes = metered_step(state, xs)
        return Measurement("fake", meter.peak, param_bytes, grad_bytes, activations, meter.peak,
                           predicted_peak=predicted_peak)

    cuda = backend == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("backend 'cuda' needs a CUDA device; use 'cpu' or 'fake'")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times: list[float] = []
    peak = grad_bytes = 0
    activation_peak = storage_peak = None
    for it in range(warmup + iterations):
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        grads = one_step(params, inputs)
        sync()
        elapsed = time.perf_counter() - start
        grad_bytes = tensor_bytes(grads)
        del grads
        drop(params)
        if it >= warmup:
            times.append(elapsed)
            if cuda:
                peak = max(peak, torch.cuda.max_memory_allocated() - base)
    if not cuda:
        # Both meters cost time (the profiler's records, the storage meter's Python dispatch of every
        # op): their steps are two more, kept out of the timings. CPU memory is the same every step.
        with AllocatorMeter("cpu") as allocator:
            one_step(params, inputs)  # its gradients' list dies here, inside the metered step, as a step's do
        drop(params)
        peak = allocator.peak
        meter, activation_peak, grad_bytes = metered_step(params, inputs)
        storage_peak = meter.peak
    return Measurement(
        backend, peak, param_bytes, grad_bytes, activation_peak, storage_peak, seconds=statistics.median(times),
        times=times, predicted_peak=predicted_peak,
    )


def training_step(runner: Callable[..., Any], params: Sequence[torch.Tensor], inputs: tuple,
                  loss_fn: Callable[[Any], torch.Tensor] = default_loss) -> None:
    """One step as a timed round runs it: forward, loss, backward, the gradients dropped (so that steps
    are alike); on a GPU the step's kernels end before it returns, so a clock around it reads the step."""
    loss_fn(runner(*inputs)).backward()
    for p in params:
        p.grad = None
    if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].is_cuda:
        torch.cuda.synchronize()


def interleaved(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each of ``steps`` in ``rounds`` rounds, every step once per round, the order rotating
    from round to round: drift on the host (clock, other load) reaches every step alike, and round i's
    times form a pair (or a block) that can be compared within the round."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            steps[n]()
            times[n].append(time.perf_counter() - t0)
    return times

