"""A schedule's memory run as eager PyTorch runs it: every value freed at its last use, and a
pointwise op writing its output into the storage of an input that dies there.

The canonical strategy holds each cached boundary ∂(L_i) until its block's backward is done, even
where its last reader ran earlier (:mod:`recompute.pricing.schedule`): that is what makes block i's memory
depend on (L_{i-1}, L_i) alone, the structure the DPs exploit, but autograd frees a saved tensor when
the last backward node that reads it has run. And eager models write in place (torchvision's
``ReLU(inplace=True)`` into the BatchNorm or convolution output it reads; autograd accumulates
gradients in place), where a traced joint graph is functional: every op of a
:class:`~recompute.pricing.schedule.Schedule` allocates its output, so a step holds a convolution's output and
its ReLU's at once where eager training holds one. :func:`in_place` drops the schedule's holds
(``Schedule.release``) and marks each op that can write into one of its inputs:

* the op is pointwise (``torch.Tag.pointwise``), draws no random numbers, returns one tensor and has
  an ``out=`` overload with a kernel of its own (``add.out``, ``threshold_backward.grad_input``, …) or,
  where that overload only computes into a new tensor and copies it, an in-place variant that writes
  into its first argument (``relu_``, as torchvision's ``ReLU(inplace=True)`` runs);
* the input has its last use at this step (over all its aliases, releases and what outlives the
  step: outputs, gradients, tangents, BatchNorm's statistics), was allocated by the step itself (no
  parameter, buffer, input, tangent or constant), is the whole of its storage and has the output's
  shape, dtype and strides, and no other argument of the op reads that storage.

The executor then calls the ``out=`` overload with that input as ``out``, or the in-place variant on it
(:mod:`recompute.doors.execute`),
and the simulator counts no new storage for the step (:func:`recompute.pricing.simulate.lifetimes`): the
same kernel over the same layout, so the values are bitwise the out-of-place op's, and the
predicted peak stays the measured one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import torch
import torch.fx as fx

from recompute.core.fxnodes import is_random, out_overload
from recompute.pricing.schedule import Instance, Schedule
from recompute.pricing.simulate import Simulation, lifetimes, simulate

if TYPE_CHECKING:
    from recompute.capture.trace import Program

__all__ = ["in_place", "simulated_in_place"]


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride() and a.storage_offset() == 0


def in_place(p: "Program", s: Schedule) -> Schedule:
    """``s`` with its values freed at their last use and every step that can write its output into
    an input's storage marked so (``Schedule.into``; see the module docstring); ``s`` itself where it
    holds nothing and no step can."""
    if s.release or s.into:
        s = replace(s, release={}, into={})
    life = lifetimes(p, s)
    table, node = life.table, life.node
    made = {st for steps in life.creates for st in steps}
    into: dict[int, Instance] = {}
    # an in-place output lives in its input's storage, whose last use becomes the output's
    last = dict(life.last)
    moved: dict[tuple[int, int], tuple[int, int]] = {}
    for step, (inst, reads) in enumerate(zip(s.steps, s.reads)):
        x = node(inst[0])
        rewrite = out_overload(x.target) if isinstance(x.target, torch._ops.OpOverload) and not is_random(x) else None
        if rewrite is None:
            continue
        out = x.meta.get("val")
        if not isinstance(out, torch.Tensor):
            continue
        read_storages = {r: [moved.get(st, st) for st in life.storages(r)] for r in reads}
        # an in-place variant (``relu_``) writes into its first argument only
        first = x.args[0].name if x.args and isinstance(x.args[0], fx.Node) else None
        candidates = reads if rewrite[1] is not None else [r for r in reads if r[0] == first]
        for r in candidates:
            held = read_storages[r]
            val = node(r[0]).meta.get("val")
            if (len(held) != 1 or held[0] not in made or last.get(held[0]) != step
                    or not isinstance(val, torch.Tensor) or not _same_layout(val, out)
                    or table.size[held[0][0]] != out.numel() * out.element_size()
                    or any(held[0] in read_storages[o] for o in reads if o != r)):
                continue
            into[step] = r
            for st in life.storages(inst):
                moved[st] = held[0]
                last[held[0]] = max(last[held[0]], life.last.get(st, step))
            break
    return replace(s, into=into) if into else s


def simulated_in_place(p: "Program") -> Callable[[Schedule], Simulation]:
    """The simulation of a schedule of ``p`` as it runs in place (:func:`in_place`): what a rewrite of a
    step that will run in place judges its peaks by."""
    return lambda s: simulate(p, in_place(p, s))
