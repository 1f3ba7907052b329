"""Workspaces: the bytes an op allocates and frees inside itself, measured on the device.

The simulator (:mod:`recompute.pricing.simulate`) counts tensor storages. The allocator also hands out what
a kernel needs only while it runs. On a CUDA device: cuDNN's convolution workspaces, the
accumulation buffers of some backward kernels, at the paper's sizes gigabytes on one op
(docs/gpu.md). On the CPU: oneDNN's reorders and scratch inside
convolutions (a 3×3 convolution's backward allocates twice its output besides it), the temporaries
of composite kernels. A plan that ignores them exceeds its budget; on the CPU our executor's steps that
recompute measured 8-12% above their simulated peak without them, and equal with them.

Like :class:`recompute.capture.timing.TimeModel` for seconds, :class:`Workspace` is a table
:class:`~recompute.capture.timing.OpKey` → bytes, each key measured once on real tensors of its layout: after
a warm-up call (cuDNN's handles and plans, cuBLAS's workspace are made once and kept), the op's
*transient* is the allocator's peak during a second call above the larger of what was allocated
before and after it (:mod:`recompute.capture.allocator`). :func:`recompute.trace` attaches the transients of
a step traced on real tensors (CUDA, or the CPU; not FakeTensors) to its program
(``Program.workspace``), and the simulator adds each op's transient to the live bytes at its step, so
every planner, budget and report that prices with the simulator sees them.

The algorithms cuDNN picks, and so its workspaces, depend on ``torch.backends.cudnn.benchmark``
(autotuning may choose others per call) and on the cuDNN version; measure with the settings training
will run under.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from recompute.capture.allocator import transients
from recompute.capture.timing import OpCall, OpKey, fill, node_call

__all__ = ["Workspace", "step_workspace", "runs_on"]


class Workspace:
    """Transient bytes per :class:`~recompute.capture.timing.OpKey`, measured on a CUDA or CPU ``device``.

    Attributes:
        device: where the ops run.
        table: every key measured so far → bytes.
    """

    def __init__(self, device: str | torch.device = "cuda"):
        self.device = torch.device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"Workspace measures the CUDA or the CPU allocator; got device {self.device}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("Workspace(device='cuda') needs a CUDA device")
        self.table: dict[OpKey, int] = {}

    def measure(self, calls: Iterable[OpCall]) -> None:
        """Measure every key of ``calls`` not measured yet."""
        if self.device.type == "cpu":
            self._measure_cpu(calls)
        else:
            fill(self.table, calls, self._transient, "measuring the workspace of")

    def _measure_cpu(self, calls: Iterable[OpCall]) -> None:
        """All new keys in one profile (:func:`recompute.capture.allocator.transients`): a profile per call
        cost more than the calls at small sizes."""
        missing = list({c.key: c for c in calls if c.key not in self.table}.values())
        if not missing:
            return

        def thunk(call: OpCall) -> Callable[[], Callable[[], Any]]:
            def made() -> Callable[[], Any]:
                args, kwargs = call.materialize(self.device)
                return lambda: call.target(*args, **kwargs)
            return made

        # real tensors even under AOTAutograd's FakeTensorMode; on a fork of the generators (dropout)
        with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
            try:
                found = transients([thunk(c) for c in missing])
            except Exception as e:
                raise RuntimeError(f"measuring the workspaces of {len(missing)} ops on the CPU failed: {e}") from e
        self.table.update({c.key: b for c, b in zip(missing, found)})

    def _transient(self, call: OpCall) -> int:
        # real tensors even where a compile backend asks under AOTAutograd's FakeTensorMode
        with unset_fake_temporarily(), torch.no_grad(), torch.cuda.device(self.device):
            args, kwargs = call.materialize(self.device)
            call.target(*args, **kwargs)  # warm-up: what the first call makes once is kept, not transient
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = call.target(*args, **kwargs)
            torch.cuda.synchronize()
            after, during = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        del out
        return max(0, during - max(before, after))

    def of_nodes(self, nodes: Iterable[fx.Node]) -> dict[str, int]:
        """fx node name → its transient bytes, for the ``call_function`` nodes of ``nodes`` that have one."""
        calls = {x.name: c for x in nodes if (c := node_call(x)) is not None}
        self.measure(calls.values())
        return {name: b for name, c in calls.items() if (b := self.table[c.key]) > 0}


def runs_on(gm: fx.GraphModule) -> torch.device | None:
    """The device the graph's placeholders live on (``meta['val']``; a CUDA one where any is), or ``None``."""
    devices = [val.device for x in gm.graph.nodes if x.op == "placeholder" and isinstance(val := x.meta.get("val"), torch.Tensor)]
    return next((d for d in devices if d.type == "cuda"), devices[0] if devices else None)


def step_workspace(gm: fx.GraphModule, on: Collection[str] = ("cuda", "cpu")) -> dict[str, int]:
    """The transients of a step's ops where it runs on a device whose type is in ``on`` and that is
    present; ``{}`` elsewhere (FakeTensors of a CUDA device on a machine without one, the meta device).
    :func:`recompute.trace` leaves the CPU out of ``on`` for a trace on FakeTensors: the ``fake``
    backend meters such a paper-scale step without them, and measuring them means running its ops."""
    device = runs_on(gm)
    if device is None or device.type not in on or (device.type == "cuda" and not torch.cuda.is_available()):
        return {}
    return Workspace(device).of_nodes(gm.graph.nodes)
