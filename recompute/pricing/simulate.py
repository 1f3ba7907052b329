"""The memory simulator: the exact peak of a :class:`~recompute.pricing.schedule.Schedule`, in bytes.

It replays the schedule the way :mod:`recompute.doors.execute` runs it and :mod:`recompute.doors.measure`
meters it: every op instance allocates its outputs (the storages of :mod:`recompute.core.storage`: each
output of a multi-output op its own, views and ``getitem`` their base's), the peak is taken with the
op's inputs and outputs alive, and then every storage whose last use (over all its views) has passed
is freed (an op run in place, ``Schedule.into``, writes into its input's storage and allocates
none); an op that allocates and frees memory inside itself (a CUDA workspace, ``Program.workspace``,
:mod:`recompute.capture.workspace`) adds it at its step. Parameters, buffers and inputs exist before the step
and are not counted; the tangents arrive when the backward phase starts and are held by the caller
until it ends; the step's outputs (parameter gradients, the model's outputs) live to the end, and the
new BatchNorm statistics until the forward phase ends, when they are written to the buffers.

:func:`simulate_partition` prices the same way a forward and a backward ``fx.GraphModule`` run as
training runs them (AOTAutograd's partitions, PyTorch's or ours).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch.fx as fx

from recompute.pricing.schedule import Instance, Schedule
from recompute.core.storage import StorageTable, joint_table

if TYPE_CHECKING:
    from recompute.capture.trace import Program

__all__ = ["Simulation", "Lifetimes", "lifetimes", "simulate", "replay", "replay_moved_last", "simulate_partition"]


@dataclass
class Simulation:
    """What :func:`simulate` found.

    Attributes:
        peak: the highest number of live bytes.
        peak_step: the step at which it happens.
        live: live bytes after each step's allocation, its op's workspace included (the memory curve).
    """

    peak: int
    peak_step: int
    live: np.ndarray


@dataclass
class _Events:
    """A schedule's storage instances as arrays (:func:`_replay`): each created one's step and size, and
    whether nothing reads it (it dies right after its step); each counted one with a last step, that
    step and its size (``freed[st]``: its index); the bytes arriving at the backward's start."""

    made_step: np.ndarray
    made_size: np.ndarray
    unread: np.ndarray
    free_step: np.ndarray
    free_size: np.ndarray
    freed: dict[tuple[int, int], int]
    arrived: int

    @classmethod
    def of(cls, size: np.ndarray, creates: Sequence[Sequence[tuple[int, int]]], last: Mapping[tuple[int, int], int],
           arriving: Iterable[tuple[int, int]]) -> "_Events":  # fmt: skip
        arriving = list(arriving)
        made = [(step, st) for step, sts in enumerate(creates) for st in sts]
        counted = {st for _, st in made} | set(arriving)  # not constants read by the steps
        freed = {st: i for i, st in enumerate(st for st in last if st in counted)}
        sizes = np.asarray(size, dtype=np.int64)
        return cls(np.fromiter((step for step, _ in made), np.int64, len(made)),
                   sizes[np.fromiter((st[0] for _, st in made), np.int64, len(made))],
                   np.fromiter((st not in last for _, st in made), bool, len(made)),
                   np.fromiter((last[st] for st in freed), np.int64, len(freed)),
                   sizes[np.fromiter((st for st, _ in freed), np.int64, len(freed))],
                   freed, int(sum(int(sizes[st]) for st, _ in arriving)))

    def curve(self, n: int, arrive: int, transient: Sequence[int] | None, made_step: np.ndarray | None = None,
              free_step: np.ndarray | None = None) -> Simulation:  # fmt: skip
        """Live bytes after each of ``n`` steps' allocations (``made_step``/``free_step``: the steps
        renumbered), its peak and the first step at it. A storage is freed after its last step; one
        whose last step is outside the ``n`` steps (the step's end, or none) lives on."""
        made = self.made_step if made_step is None else made_step
        free = self.free_step if free_step is None else free_step
        inside = (free >= 0) & (free < n)
        gone = made[self.unread]
        # float64 sums of whole byte counts are exact below 2**53 bytes
        delta = (np.bincount(made, self.made_size, minlength=n + 1)
                 - np.bincount(free[inside] + 1, self.free_size[inside], minlength=n + 1)
                 - np.bincount(gone + 1, self.made_size[self.unread], minlength=n + 1))
        if 0 <= arrive < n:
            delta[arrive] += self.arrived
        live = np.rint(np.cumsum(delta[:n])).astype(np.int64)
        if transient is not None:
            live += np.asarray(transient, dtype=np.int64)
        top = int(live.max()) if n else 0
        return Simulation(peak=max(top, 0), peak_step=int(live.argmax()) if top > 0 else 0, live=live)


def _replay(size: np.ndarray, creates: Sequence[Sequence[tuple[int, int]]], last: Mapping[tuple[int, int], int],
            arrive: int, arriving: Iterable[tuple[int, int]], transient: Sequence[int] | None = None) -> Simulation:  # fmt: skip
    """Live bytes step by step: storage instances (storage, copy) appear when their step creates them
    (``arriving`` ones at step ``arrive``) and are freed after their ``last`` step; one that nothing
    reads dies right after the step that made it; ``transient[step]`` bytes exist during the step
    alone. Storages neither created nor arriving (parameters, inputs) are not counted."""
    return _Events.of(size, creates, last, arriving).curve(len(creates), arrive, transient)


def _extend(last: dict[tuple[int, int], int], storages: Iterable[tuple[int, int]], step: int) -> None:
    for st in storages:
        last[st] = max(last.get(st, -1), step)


@dataclass
class Lifetimes:
    """Where each op instance of a schedule lives and until when (:func:`lifetimes`).

    Attributes:
        table, node: the joint graph's storage table and its nodes by name.
        creates: for each step, the storage instances (storage, copy) it allocates.
        last: storage instance → the last step that needs it (a read through any alias, a release,
            the end of the forward phase for BatchNorm's new statistics, the end of the step for the
            tangents, the model's outputs and the gradients).
        tangents: the tangents' storage instances (they arrive when the backward phase starts).
        copy: op instance → the copy of its storages a read of it keeps alive (an alias: its base's).
        moved: an in-place output's own storage instance → the one it lives in.
        workspace: bytes each step allocates and frees inside its op (``Program.workspace``), or None.
    """

    table: StorageTable
    node: Callable[[str], fx.Node]
    creates: list[list[tuple[int, int]]]
    last: dict[tuple[int, int], int]
    tangents: list[tuple[int, int]]
    copy: dict[Instance, int]
    moved: dict[tuple[int, int], tuple[int, int]]
    workspace: np.ndarray | None = None
    _events: _Events | None = field(default=None, init=False, repr=False, compare=False)
    _reads: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def events(self) -> _Events:
        """The storages as arrays, found once (a search replays one schedule's lifetimes many times)."""
        if self._events is None:
            self._events = _Events.of(self.table.size, self.creates, self.last, self.tangents)
        return self._events

    def freed_reads(self, s: Schedule) -> tuple[np.ndarray, np.ndarray]:
        """For each step of ``s`` (the schedule of these lifetimes), the storages its reads keep alive
        that are freed (their indices in ``events().free_step``): offsets per step, then the indices."""
        if self._reads is None:
            freed = self.events().freed
            per = [[i for r in reads for st in self.storages(r) if (i := freed.get(st)) is not None]
                   for reads in s.reads]
            offsets = np.zeros(len(per) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(x) for x in per])
            self._reads = offsets, np.fromiter(itertools.chain.from_iterable(per), np.int64, int(offsets[-1]))
        return self._reads

    def storages(self, inst: Instance) -> list[tuple[int, int]]:
        """The storage instances a read of ``inst`` keeps alive (none for a parameter or an input)."""
        c = self.copy.get(inst)
        if c is None:
            return []
        of = self.table.by_name[1].get(inst[0], ())
        if not self.moved:
            return [(st, c) for st in of]
        return [self.moved.get((st, c), (st, c)) for st in of]


def lifetimes(p: "Program", s: Schedule) -> Lifetimes:
    """The storages of ``s`` on the joint graph of ``p``: an op instance allocates one copy of its
    storages, an alias keeps its base's copy alive, and a step ``s.into`` writes in place allocates
    nothing, its output living in the storage of the instance it writes into."""
    joint = p.joint
    life = Lifetimes(joint_table(joint), joint.node, [], {}, [], {(name, 0): 0 for name in joint.tangents}, {})
    made_by, copy = life.table.by_name[0], life.copy
    for step, (inst, reads) in enumerate(zip(s.steps, s.reads)):
        made = made_by.get(inst[0])
        if made is not None:
            copy[inst] = inst[1]
            own = [(st, inst[1]) for st in made]
            if step in s.into:
                (target,) = life.storages(s.into[step])
                life.moved.update((st, target) for st in own)
                own = []
            life.creates.append(own)
        else:
            if reads and reads[0] in copy:
                copy[inst] = copy[reads[0]]
            life.creates.append([])
    last, n = life.last, len(s.steps)
    # what a read of each instance keeps alive, found once; the steps rise, so its last read so far
    # is its last (a search judges thousands of schedules: one storages() call per instance, not per read)
    held: dict[Instance, int] = {}
    for step, reads in enumerate(s.reads):
        for r in reads:
            held[r] = step
    for r, step in held.items():
        for st in life.storages(r):
            if last.get(st, -1) < step:
                last[st] = step
    for step, insts in s.release.items():
        for r in insts:
            _extend(last, life.storages(r), step)
    for name in joint.buffer_writes:
        _extend(last, life.storages((name, 0)), s.backward_start - 1)
    life.tangents = [st for name in joint.tangents for st in life.storages((name, 0))]
    # the tangents are held by the caller (``backward()``'s arguments) until the backward ends
    _extend(last, life.tangents, n)
    for name in [*(x.name for x in joint.user_outputs), *joint.gradients]:
        _extend(last, life.storages((name, 0)), n)
    if p.workspace:
        life.workspace = np.fromiter((p.workspace.get(name, 0) for name, _ in s.steps), np.int64, n)
    return life


def simulate(p: "Program", s: Schedule) -> Simulation:
    """Replay ``s`` on the joint graph of ``p`` and return its exact peak."""
    return replay(s, lifetimes(p, s))


def replay(s: Schedule, life: Lifetimes) -> Simulation:
    """:func:`simulate` of ``s`` whose lifetimes ``life`` (``lifetimes(p, s)``) are known."""
    return life.events().curve(len(s), s.backward_start, life.workspace)


def replay_moved_last(s: Schedule, life: Lifetimes, moved: Sequence[int]) -> Simulation:
    """:func:`simulate` of ``s`` with its steps ``moved`` (indices, ascending) run after all the others
    in their order, from ``s``'s lifetimes ``life`` (``s`` without in-place writes): the others keep
    their order, so a storage only they read dies after the same step as before, and one a moved step
    reads, after the last moved step that reads it. Every value a moved step makes must be read by
    moved steps or the step's end alone."""
    n, events = len(s), life.events()
    moved = np.asarray(moved, dtype=np.int64)
    gone = np.zeros(n, dtype=bool)
    gone[moved] = True
    order = np.concatenate([np.flatnonzero(~gone), moved])
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)
    free = events.free_step.copy()
    inside = (free >= 0) & (free < n)  # a value held to the step's end (or never freed) stays so
    free[inside] = place[free[inside]]
    offsets, indices = life.freed_reads(s)
    counts = offsets[moved + 1] - offsets[moved]
    starts = np.repeat(offsets[moved] - np.cumsum(counts) + counts, counts)
    read = indices[starts + np.arange(int(counts.sum()))]
    at = np.repeat(place[moved], counts)
    np.maximum.at(free, read[inside[read]], at[inside[read]])
    return events.curve(n, s.backward_start, None if life.workspace is None else life.workspace[order],
                        made_step=place[events.made_step], free_step=free)


def simulate_partition(forward: fx.GraphModule, backward: fx.GraphModule, *,
                       received: Mapping[str, str] | None = None, hold_saved: bool = False,
                       workspace: Mapping[str, int] | None = None) -> Simulation:  # fmt: skip
    """The peak of one training step run as a (forward, backward) pair of ``fx.GraphModule``\\ s whose
    nodes carry ``meta["val"]``, such as AOTAutograd's partitioners return.

    The forward's call_function nodes run in graph order, then the backward's. The forward's
    placeholders (parameters, buffers, inputs) and constants exist before the step and are not
    counted. A backward placeholder is handed the forward value named ``received[name]`` (default: the
    forward node of the same name, AOTAutograd's convention for saved values); the others (the
    tangents) arrive when the backward starts and are held to its end. A saved value lives until its
    last read in the backward (``hold_saved``: to the end, as when the caller keeps the saved tensors
    through the whole backward); the forward's other outputs (the model's outputs, updated buffers)
    and the backward's outputs (the gradients) live to the end of the step. ``workspace`` (fx node
    name → bytes, :mod:`recompute.capture.workspace`) exists during its op's step alone. Returns the
    :class:`Simulation` over the steps, forward first.
    """
    fwd_by_name = {x.name: x for x in forward.graph.nodes}
    bwd_inputs = [x for x in backward.graph.nodes if x.op == "placeholder"]
    names = received if received is not None else {x.name: x.name for x in bwd_inputs if x.name in fwd_by_name}
    links: dict[fx.Node, fx.Node] = {}
    for x in bwd_inputs:
        if x.name in names:
            if names[x.name] not in fwd_by_name:
                raise ValueError(f"simulate_partition: received[{x.name!r}] = {names[x.name]!r} names no node of "
                                 "the forward module; map each saved input of the backward to a forward node")
            links[x] = fwd_by_name[names[x.name]]
    table = StorageTable.build([*forward.graph.nodes, *backward.graph.nodes], links)
    steps = [x for g in (forward, backward) for x in g.graph.nodes if x.op == "call_function"]
    backward_start = sum(1 for x in forward.graph.nodes if x.op == "call_function")
    creates = [[(st, 0) for st in table.made.get(x, ())] for x in steps]
    n = len(steps)
    last: dict[tuple[int, int], int] = {}
    for step, x in enumerate(steps):
        _extend(last, ((st, 0) for st in table.reads(x)), step)
    given = [(st, 0) for x in bwd_inputs if x not in links for st in table.of.get(x, ())]
    _extend(last, given, n)
    if hold_saved:
        _extend(last, ((st, 0) for x in links for st in table.of.get(x, ())), n)
    # forward outputs the backward is not handed (a value handed once and returned twice is both)
    handed = Counter(links.values())
    for x in _outputs(forward):
        if handed[x] > 0:
            handed[x] -= 1
        else:
            _extend(last, ((st, 0) for st in table.of.get(x, ())), n)
    for x in _outputs(backward):
        _extend(last, ((st, 0) for st in table.of.get(x, ())), n)
    transient = [workspace.get(x.name, 0) for x in steps] if workspace else None
    return _replay(table.size, creates, last, backward_start, given, transient)


def _outputs(gm: fx.GraphModule) -> list[fx.Node]:
    """The fx nodes ``gm`` returns (flattened)."""
    out: list[fx.Node] = []
    for x in gm.graph.nodes:
        if x.op == "output":
            fx.node.map_arg(x.args, out.append)
    return out

