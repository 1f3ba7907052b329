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

import weakref
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import torch
import torch.fx as fx

from recompute.core.fxnodes import is_random, out_overload
from recompute.pricing.schedule import Instance, Schedule
from recompute.pricing.simulate import Lifetimes, Simulation, lifetimes, replay

if TYPE_CHECKING:
    from recompute.capture.joint import JointProgram
    from recompute.capture.trace import Program

__all__ = ["in_place", "simulated_in_place", "writers"]


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride() and a.storage_offset() == 0


@dataclass(frozen=True)
class _Writer:
    """A joint-graph op that may write its output into an input: ``out`` its traced output, ``only``
    the one input it may write into (an in-place variant writes into its first argument), None: any."""

    out: torch.Tensor
    nbytes: int
    only: str | None
    layouts: dict[str, bool] = field(default_factory=dict)  # input name → whether it has ``out``'s layout

    def fits(self, name: str, node: Callable[[str], fx.Node]) -> bool:
        """Whether the value ``name`` has this op's output's shape, dtype and strides, whole."""
        if name not in self.layouts:
            val = node(name).meta.get("val")
            self.layouts[name] = isinstance(val, torch.Tensor) and _same_layout(val, self.out)
        return self.layouts[name]


_WRITERS: "weakref.WeakKeyDictionary[JointProgram, dict[str, _Writer]]" = weakref.WeakKeyDictionary()


def writers(joint: "JointProgram") -> dict[str, _Writer]:
    """The ops of ``joint`` that may write in place, by name: found once per joint graph, since a
    search judges thousands of schedules of one graph (:func:`recompute.rewrites.peak.recompute_at_peak`)."""
    if joint not in _WRITERS:
        found = {}
        for x in joint.gm.graph.nodes:
            rewrite = out_overload(x.target) if isinstance(x.target, torch._ops.OpOverload) and not is_random(x) else None
            out = x.meta.get("val")
            if rewrite is None or not isinstance(out, torch.Tensor):
                continue
            first = x.args[0].name if x.args and isinstance(x.args[0], fx.Node) else None
            if rewrite[1] is None and first is None:
                continue
            found[x.name] = _Writer(out, out.numel() * out.element_size(), None if rewrite[1] is not None else first)
        _WRITERS[joint] = found
    return _WRITERS[joint]


def _written(p: "Program", s: Schedule) -> tuple[Schedule, Lifetimes]:
    """:func:`in_place`'s schedule and its lifetimes, equal to ``lifetimes(p, schedule)`` (found while
    the writes are chosen, so that judging a schedule run in place traces its lifetimes once)."""
    if s.release or s.into:
        s = replace(s, release={}, into={})
    life = lifetimes(p, s)
    table, node, may_write = life.table, life.node, writers(p.joint)
    made = {st for steps in life.creates for st in steps}
    into: dict[int, Instance] = {}
    # an in-place output lives in its input's storage, whose last use becomes the output's
    last = dict(life.last)
    moved: dict[tuple[int, int], tuple[int, int]] = {}
    for step, (inst, reads) in enumerate(zip(s.steps, s.reads)):
        w = may_write.get(inst[0])
        if w is None:
            continue
        # an in-place variant (``relu_``) writes into its first argument only
        for r in (reads if w.only is None else [r for r in reads if r[0] == w.only]):
            if not w.fits(r[0], node):
                continue
            held = [moved.get(st, st) for st in life.storages(r)]
            if (len(held) != 1 or held[0] not in made or last.get(held[0]) != step
                    or table.size[held[0][0]] != w.nbytes
                    or any(held[0] == moved.get(st, st) for o in reads if o != r for st in life.storages(o))):
                continue
            into[step] = r
            for st in life.storages(inst):
                moved[st] = held[0]
                last[held[0]] = max(last[held[0]], last.pop(st, step))
            break
    if not into:
        return s, life
    creates = [[] if step in into else made_here for step, made_here in enumerate(life.creates)]
    return replace(s, into=into), replace(life, creates=creates, last=last, moved=moved)


def in_place(p: "Program", s: Schedule) -> Schedule:
    """``s`` with its values freed at their last use and every step that can write its output into
    an input's storage marked so (``Schedule.into``; see the module docstring); ``s`` itself where it
    holds nothing and no step can."""
    return _written(p, s)[0]


def simulated_in_place(p: "Program") -> Callable[[Schedule], Simulation]:
    """The simulation of a schedule of ``p`` as it runs in place (:func:`in_place`): what a rewrite of a
    step that will run in place judges its peaks by."""
    return lambda s: replay(*_written(p, s))
