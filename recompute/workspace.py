"""Workspaces: the bytes an op allocates and frees inside itself, measured on the device.

The simulator (:mod:`recompute.simulate`) counts tensor storages. On a CUDA device the caching
allocator also hands out what a kernel needs only while it runs — cuDNN's convolution workspaces,
the accumulation buffers of some backward kernels — and at the paper's sizes these reach 1.9 GiB on
one op (docs/benchmarks.md, "On a CUDA GPU"). A plan that ignores them exceeds its budget on the GPU.

Like :class:`recompute.timing.TimeModel` for seconds, :class:`Workspace` is a table
:class:`~recompute.timing.OpKey` → bytes, each key measured once on real tensors of its layout: after
a warm-up call (cuDNN's handles and plans, cuBLAS's workspace are made once and kept), the op's
*transient* is the allocator's peak during a second call above the larger of what was allocated
before and after it. :func:`recompute.trace` attaches the transients of a step traced on a CUDA device
to its program (``Program.workspace``), and the simulator adds each op's transient to the live bytes
at its step, so every planner, budget and report that prices with the simulator sees them.

The algorithms cuDNN picks, and so its workspaces, depend on ``torch.backends.cudnn.benchmark``
(autotuning may choose others per call) and on the cuDNN version; measure with the settings training
will run under.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .timing import OpCall, OpKey, fill, node_call

__all__ = ["Workspace", "step_workspace", "runs_on_cuda"]


class Workspace:
    """Transient bytes per :class:`~recompute.timing.OpKey`, measured on a CUDA ``device``.

    Attributes:
        device: where the ops run.
        table: every key measured so far → bytes.
    """

    def __init__(self, device: str | torch.device = "cuda"):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"Workspace measures the CUDA caching allocator; got device {self.device}. On the CPU "
                             "an op's internal buffers are not the allocator's to see, and the simulator counts none")
        if not torch.cuda.is_available():
            raise RuntimeError("Workspace(device='cuda') needs a CUDA device")
        self.table: dict[OpKey, int] = {}

    def measure(self, calls: Iterable[OpCall]) -> None:
        """Measure every key of ``calls`` not measured yet."""
        fill(self.table, calls, self._transient, "measuring the workspace of")

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


def runs_on_cuda(gm: fx.GraphModule) -> torch.device | None:
    """The CUDA device the graph's placeholders live on (``meta['val']``), or ``None``."""
    for x in gm.graph.nodes:
        val = x.meta.get("val")
        if x.op == "placeholder" and isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device
    return None


def step_workspace(gm: fx.GraphModule) -> dict[str, int]:
    """The transients of a step's ops where it runs on a CUDA device that is present; ``{}`` elsewhere
    (the CPU, FakeTensors of a CUDA device on a machine without one)."""
    device = runs_on_cuda(gm)
    if device is None or not torch.cuda.is_available():
        return {}
    return Workspace(device).of_nodes(gm.graph.nodes)
