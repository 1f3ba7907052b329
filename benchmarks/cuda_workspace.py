"""Where a CUDA step's peak exceeds the simulator's: the bytes each op allocates and frees inside itself.

    python -m benchmarks.cuda_workspace --nets vgg19 unet --methods vanilla approxdp_tc   # on a CUDA GPU

The simulator counts tensor storages; the caching allocator also hands out what a kernel needs only while
it runs (cuDNN's and cuBLAS's workspaces). Per network and plan, at the paper's batch and size, one step
runs under a dispatch mode that reads ``torch.cuda.memory_allocated`` before and after each op and the
allocator's peak during it: the *transient* of an op is that peak above the larger of the two. The table
gives the simulated peak, the measured CUDA peak, the peak the step would have had without transients
(the largest before/after of any op), and the ops with the largest transients.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import recompute
from experiments import nets
from recompute.doors.measure import default_loss

from .common import head_commit, made_by, markdown_table, write_doc

GIB, MIB = 2**30, 2**20


class Transients(TorchDispatchMode):
    """Per op: the allocator's peak during it above the larger of what was allocated before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.steady = 0  # the largest allocated before or after any op
        self.peak = 0  # the largest allocated during any op
        self.by_op: Counter[str] = Counter()  # op → its largest transient

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        after, during = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        self.steady, self.peak = max(self.steady, before, after), max(self.peak, during)
        name = str(func.overloadpacket)
        self.by_op[name] = max(self.by_op[name], during - max(before, after))
        return out


@dataclass
class Breakdown:
    """One plan's CUDA step beside its simulated peak (bytes above what existed before the step)."""

    network: str
    plan: str
    simulated: int
    measured: int  # recompute.measure(backend="cuda")
    steady: int  # the largest allocated before or after any op: the peak without transients
    during: int  # the largest allocated during any op, under the mode
    transients: dict[str, int]  # op → its largest transient, the largest first

    def row(self) -> list[str]:
        top = ", ".join(f"{op} {b / MIB:.0f}" for op, b in list(self.transients.items())[:4] if b > 0)
        return [self.network, self.plan, *(f"{b / GIB:.3f}" for b in (self.simulated, self.measured, self.steady,
                                                                       self.during)), top]


def run(name: str, labels: list[str], batch: int | None = None, size: int | None = None) -> list[Breakdown]:
    """A breakdown per plan (``vanilla``, ``chen``, ``approxdp_tc``, ...) of network ``name``, at the
    paper's batch and input size unless given."""
    model, inputs = nets.build(name, batch_size=batch, input_size=size, seed=0)
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    out = []
    for label in labels:
        method, strategy = (label[:-3], label[-2:]) if label.endswith(("_tc", "_mc")) else (label, None)
        plan = recompute.plan(graph, method, strategy=strategy)
        runner = recompute.execute(graph, plan, model)
        measured = recompute.measure(model, inputs, runner=runner, backend="cuda", iterations=1).peak_bytes
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        mode = Transients()
        with mode:
            runner(*inputs).backward()  # traced with the loss: the runner returns it
        for p in model.parameters():
            p.grad = None
        out.append(Breakdown(name, label, plan.peak, measured, mode.steady - base, mode.peak - base,
                             dict(mode.by_op.most_common())))
        print(" | ".join(out[-1].row()), flush=True)
    return out


HEADERS = ["network", "plan", "simulated GiB", "CUDA peak GiB", "without transients GiB",
           "under the mode GiB", "largest transients (MiB)"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=["vgg19", "unet", "resnet50"])
    parser.add_argument("--methods", nargs="+", default=["vanilla", "approxdp_tc", "exactdp_tc"])
    parser.add_argument("--write", action="store_true", help="update docs/gpu.md")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.cuda_workspace needs a CUDA GPU (torch.cuda.is_available() is False)")
    commit = head_commit()
    rows = [b.row() for name in args.nets for b in run(name, args.methods)]
    device = f"on {torch.cuda.get_device_name()}"
    text = f"{made_by(commit, device, f'torch {torch.__version__}', argv=argv)}\n\n{markdown_table(HEADERS, rows)}"
    print(text)
    if args.write:
        write_doc("cuda-workspace", text)


if __name__ == "__main__":
    main()
