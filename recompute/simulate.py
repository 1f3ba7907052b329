"""The memory simulator: the exact peak of a :class:`~recompute.schedule.Schedule`, in bytes.

It replays the schedule the way :mod:`recompute.execute` runs it and :mod:`recompute.measure`
meters it: every op instance allocates its outputs (each output of a multi-output op its own storage;
views and ``getitem`` share their base's), the peak is taken with the op's inputs and outputs alive,
and then every storage whose last use (over all its views) has passed is freed. Parameters, buffers
and inputs exist before the step and are not counted; the tangents arrive when the backward phase
starts and are held by the caller until it ends; the step's outputs (parameter gradients, the model's outputs) live to the end, and the new
BatchNorm statistics until the forward phase ends, when they are written to the buffers.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .fxnodes import output_tensors
from .schedule import Instance, Schedule, is_alias

if TYPE_CHECKING:
    from .trace import Program

__all__ = ["Simulation", "simulate"]

Storage = tuple[str, int, "int | None"]  # (op node, copy, output index)


@dataclass
class Simulation:
    """What :func:`simulate` found.

    Attributes:
        peak: the highest number of live bytes.
        peak_step: the step at which it happens.
        live: live bytes after each step's allocation (the memory curve).
    """

    peak: int
    peak_step: int
    live: np.ndarray


def simulate(p: "Program", s: Schedule) -> Simulation:
    """Replay ``s`` on the joint graph of ``p`` and return its exact peak."""
    joint = p.joint
    # storage of every value instance: op outputs are their own, aliases share their base's
    storage_of: dict[Instance, Storage | None] = {}
    size: dict[Storage, int] = {}
    for name in joint.tangents:
        node = joint.node(name)
        st = (name, 0, None)
        storage_of[(name, 0)] = st
        size[st] = sum(t.numel() * t.element_size() for _, t in output_tensors(node.meta.get("val")))
    creates: list[list[Storage]] = []
    for inst, reads in zip(s.steps, s.reads):
        node = joint.node(inst[0])
        if is_alias(node):
            base = storage_of.get(reads[0]) if reads else None
            if node.target is operator.getitem and base is not None and base[2] is None:
                base = (base[0], base[1], node.args[1])  # element of a multi-output op
            storage_of[inst] = base
            creates.append([])
            continue
        outs = output_tensors(node.meta.get("val"))
        made = []
        for i, t in outs:
            st = (inst[0], inst[1], i)
            size[st] = t.numel() * t.element_size()
            made.append(st)
        storage_of[inst] = made[0] if len(made) == 1 else (inst[0], inst[1], None)
        creates.append(made)
    elements: dict[Instance, list[Storage]] = {}
    for st in size:
        elements.setdefault((st[0], st[1]), []).append(st)

    def whole(st: Storage) -> list[Storage]:
        """A multi-output value (index None, no storage of its own) stands for all its outputs."""
        return [st] if st in size else elements.get((st[0], st[1]), [])

    # last use of every storage: reads (through aliases), releases, and the step's outputs
    n = len(s.steps)
    last: dict[Storage, int] = {}
    for step, reads in enumerate(s.reads):
        for r in reads:
            st = storage_of.get(r)
            if st is None:
                continue
            for target in whole(st):
                last[target] = max(last.get(target, -1), step)
    for step, insts in s.release.items():
        for r in insts:
            st = storage_of.get(r)
            if st is not None:
                for target in whole(st):
                    last[target] = max(last.get(target, -1), step)
    forward_end = s.backward_start - 1
    for name in joint.buffer_writes:
        st = storage_of.get((name, 0))
        if st is not None:
            last[st] = max(last.get(st, -1), forward_end)
    # the tangents are held by the caller (``backward()``'s arguments) until the backward ends
    for name in joint.tangents:
        last[storage_of[(name, 0)]] = n
    for node in [*joint.user_outputs, *(joint.node(g) for g in joint.gradients)]:
        st = storage_of.get((node.name, 0))
        if st is not None:
            for target in whole(st):
                last[target] = n
    dies: dict[int, list[Storage]] = {}
    for st, step in last.items():
        dies.setdefault(step, []).append(st)
    live_now = 0
    curve = np.zeros(n, dtype=np.int64)
    peak, peak_step = 0, 0
    tangent_storages = [storage_of[(t, 0)] for t in joint.tangents]
    for step in range(n):
        if step == s.backward_start:
            live_now += sum(size[t] for t in tangent_storages)
        for st in creates[step]:
            live_now += size[st]
        curve[step] = live_now
        if live_now > peak:
            peak, peak_step = live_now, step
        for st in dies.get(step, ()):
            live_now -= size[st]
        # a created storage nothing reads dies at once
        for st in creates[step]:
            if st not in last:
                live_now -= size[st]
    return Simulation(peak=int(peak), peak_step=peak_step, live=curve)
