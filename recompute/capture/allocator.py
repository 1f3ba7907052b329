"""What PyTorch's allocator hands out: the meter behind measured peaks and the CPU's workspaces.

A ``TorchDispatchMode`` sees the tensors ATen ops return; it does not see what an op allocates and
frees inside itself (oneDNN's reorders and scratch inside a CPU convolution, about twice the output
of a 3×3 convolution's backward), nor the buffers of code that
inductor compiled. The allocator sees both. On CUDA its statistics are kept by the caching allocator
(``torch.cuda.max_memory_allocated``); on the CPU, the profiler reports every allocation and free
of PyTorch's CPU allocator as a memory event (``profile_memory=True``), and the running sum of those
events in time order is the bytes allocated since the profile began.

:class:`AllocatorMeter` takes the peak of a block of code that way; :func:`transients` the bytes each
op call allocates above its own inputs and outputs (:mod:`recompute.capture.workspace`), all calls in one
profile.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch

__all__ = ["AllocatorMeter", "transients"]


def _profile() -> Any:
    """A CPU profile that records the allocator's memory events and nothing it need not."""
    # kineto logs each profile's start and stop on stderr unless told its level is above them; read
    # once, when the first profile starts (a setting of the user's stands)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


def _memory_events(prof: Any) -> list[tuple[int, int]]:
    """(time in ns, bytes: + allocated, − freed) of the CPU allocator's memory events, in time order."""
    cpu = torch._C._autograd.DeviceType.CPU
    return sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == cpu)


def _peak(deltas: Sequence[int]) -> tuple[int, int]:
    """The running sum's maximum (never below 0) and its final value."""
    live = peak = 0
    for b in deltas:
        live += b
        peak = max(peak, live)
    return peak, live


class AllocatorMeter:
    """The bytes PyTorch's allocator hands out on ``device`` inside a ``with`` block, above what was
    allocated when it began: ``peak`` the high-water mark, ``end`` what is still allocated at its end
    (both set on exit). On the CPU it profiles the block (see the module docstring): it sees inductor's
    compiled buffers and the ops' internal scratch, at the price of a profiled step. On CUDA it reads
    the caching allocator's statistics (it resets the peak statistic)."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"AllocatorMeter meters the cpu or cuda allocator; got device {self.device}")
        self.peak = self.end = 0
        self._prof: Any = None
        self._base = 0

    def __enter__(self) -> "AllocatorMeter":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._prof = _profile()
            self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            self.end = torch.cuda.memory_allocated(self.device) - self._base
            return
        self._prof.__exit__(*exc)
        self.peak, self.end = _peak([b for _, b in _memory_events(self._prof)])
        self._prof = None


def transients(calls: Sequence[Callable[[], Any]]) -> list[int]:
    """For each CPU op call (a thunk that makes its own inputs), the bytes it allocates and frees
    inside itself: the allocator's peak during a second call above the larger of what it allocated
    before and after (its outputs). The first call is a warm-up: what an op makes once and keeps (a
    kernel's set-up) is not transient. One profile holds all the calls; each second call is marked by
    a ``record_function`` range, and the memory events inside a range are its call's."""
    from torch.profiler import record_function

    with _profile() as prof:
        for i, call in enumerate(calls):
            run = call()
            run()
            with record_function(f"recompute.transient.{i}"):
                out = run()
            del out, run
    events = prof.profiler.kineto_results.events()
    prefix = "recompute.transient."
    ranges = sorted((e.start_ns(), e.end_ns(), int(e.name()[len(prefix):])) for e in events
                    if e.is_user_annotation() and e.name().startswith(prefix))
    memory = _memory_events(prof)
    found = [0] * len(calls)
    j = 0
    for start, stop, i in ranges:
        while j < len(memory) and memory[j][0] < start:
            j += 1
        inside = []
        while j < len(memory) and memory[j][0] <= stop:
            inside.append(memory[j][1])
            j += 1
        peak, end = _peak(inside)
        found[i] = max(0, peak - max(0, end))
    return found
