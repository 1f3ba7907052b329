"""Recomputation where the peak is: what a step holds across its peak is computed again after it.

A lower-set plan recomputes each block once, in the canonical order (:mod:`recompute.pricing.schedule`), and
:func:`recompute.rewrites.remat.recompute_late` computes cheap single values once more before late reads. What
makes a step's peak is often neither: a value of any kind that waits across the peak for a later
reader, or a recomputation that runs long before its reader needs it. On VGG-19 (batch 64, 224²,
split convolution backwards) the first block's 0.77-GiB ReLU outputs wait through a max-pool's
backward: recomputing the first block's convolution of the 3-channel input twice more, right where
the second convolution's weight gradient and the first ReLU's backward read it, lowers the memory-centric
DP's step run in place at a few cost units more (docs/paper_scale.md). :func:`recompute_at_peak`
works on the step's simulated memory curve, greedily, with three moves:

* **sink** (:func:`sunk`): each recomputation of the backward phase runs right before its first
  reader, where what it reads is held until then anyway (a parameter, an input, a value read later,
  or a recomputation sunk in turn);
* **again** (:func:`computed_again`): a value made before the peak and read after it, but not at it, is
  computed anew right before its next read, through the forward ops that make it from what is still
  held there (those not held are recomputed in turn, at most ``max_ops`` ops of V or products), and read
  as that new copy from there on: the old copy dies at its last read before the peak;
* **gradients late** (:func:`gradients_late`): an op of the backward that only the step's end reads (a
  parameter's gradient, and what reads nothing but it) runs at the step's end instead of before the
  peak: on VGG-19 the classifier's weight gradients (0.46 GiB at any batch) then wait for the
  convolutions' backward to end, as in torch.compile's step (docs/pytorch.md: its peak is the parameter
  gradients'). No recomputation; what the moved op reads is held longer, and the simulated peak judges it.

Each round tries the values waiting across the peak, most bytes per unit of added recomputation first
(Σ T_v of the new copies, :func:`recompute.pricing.schedule.recomputation_cost`), takes the first that lowers
the peak (or, at an equal peak, the number of steps at it), and sinks again (a value whose new copy
cannot change that score is not simulated: :func:`_unchanged_score`); where none does, it moves
gradients late (as it does first), and it stops where that does not lower the score either, or where the
added recomputation would pass ``limit``. Random ops and ops that write their inputs are
never run again (their values are held), and neither is an op that reads a buffer the step writes.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch.utils.flop_counter import flop_registry

from recompute.capture.convsplit import SPLIT_FROM
from recompute.core.fxnodes import runs_once
from recompute.pricing.schedule import Instance, Schedule, recomputation_cost
from recompute.pricing.simulate import Simulation, lifetimes, replay, replay_moved_last, simulate
from recompute.core.storage import joint_table
from recompute.rewrites.inplace import writers

if TYPE_CHECKING:
    from recompute.core.graph import Graph
    from recompute.capture.joint import JointProgram
    from recompute.capture.trace import Program

__all__ = ["sunk", "computed_again", "gradients_late", "recompute_at_peak", "needed_splits"]

_TRAINING_BATCH_NORM = torch.ops.aten._native_batch_norm_legit_functional.default
_FORWARD: "weakref.WeakKeyDictionary[JointProgram, tuple[frozenset[str], frozenset[str]]]" = weakref.WeakKeyDictionary()


def _again_allowed(p: "Program", name: str) -> bool:
    """Whether the joint graph's op ``name`` may run once more: a forward op that draws no random
    numbers, writes no input, and reads no buffer the step writes (a training-mode BatchNorm excepted:
    its outputs do not depend on the statistics it updates)."""
    joint = p.joint
    if joint not in _FORWARD:  # the forward's ops and the written buffers' placeholders, found once
        written = set(joint.buffer_writes.values())
        _FORWARD[joint] = (frozenset(n.name for n in joint.forward),
                           frozenset(name for name, fqn in joint.buffers.items() if fqn in written))
    forward, written_buffers = _FORWARD[joint]
    node = joint.node(name)
    if name not in forward or runs_once(node):
        return False
    return node.target is _TRAINING_BATCH_NORM or not any(a.name in written_buffers for a in node.all_input_nodes)


def sunk(p: "Program", s: Schedule) -> Schedule:
    """``s`` with each recomputation of its backward phase moved right before its first reader, where
    each value it reads is a placeholder or constant, a recomputation (moved in turn), or read at or
    after that reader anyway; the latest first, so that a chain of recomputations moves together.
    ``s`` is taken without holds (``release``) or in-place marks."""
    b, n = s.backward_start, len(s)
    made = {inst: i for i, inst in enumerate(s.steps)}
    readers: dict[Instance, list[int]] = {}
    for i in range(b, n):
        for r in s.reads[i]:
            readers.setdefault(r, []).append(i)
    # the new order as sort keys: a step that stays keeps (i, 0); one moved before step t takes t's key
    # with (-1, i) inserted before its last element, so that it sorts right before t, after what was
    # moved before t from earlier in the schedule, and after what is moved before it later
    key: list[tuple[int, ...]] = [(i, 0) for i in range(n)]
    for i in range(n - 1, b - 1, -1):
        inst = s.steps[i]
        if inst[1] == 0 or not _again_allowed(p, inst[0]) or not readers.get(inst):
            continue
        first = min(readers[inst], key=key.__getitem__)
        if first == i + 1 and key[first] == (first, 0):
            continue

        def held_anyway(x: Instance) -> bool:
            if x not in made or x[1] > 0:
                return True
            return any(key[j] >= key[first] for j in readers.get(x, ()) if j != i)

        if all(held_anyway(x) for x in s.reads[i]):
            key[i] = (*key[first][:-1], -1, i, 0)
    order = sorted(range(n), key=key.__getitem__)
    return s if order == list(range(n)) else _in_order(s, order)


def _in_order(s: Schedule, order: list[int]) -> Schedule:
    """``s``'s steps in ``order`` (a permutation of them that keeps the phases), without holds or in-place marks."""
    return Schedule(steps=[s.steps[i] for i in order], reads=[s.reads[i] for i in order],
                    backward_start=s.backward_start, block=[s.block[i] for i in order] if s.block else [])


def _score(sim: Simulation) -> tuple[int, int]:
    """What the moves lower: the peak, then the number of steps at it."""
    return sim.peak, int((sim.live >= sim.peak).sum())


def _for_the_end(s: Schedule, ends: set[str]) -> tuple[dict[Instance, list[int]], list[bool]]:
    """The backward steps reading each value, and for each step whether only the step's end (the
    values named ``ends``) and steps of that kind read what it makes."""
    n, b = len(s), s.backward_start
    readers: dict[Instance, list[int]] = {}
    for i in range(b, n):
        for r in s.reads[i]:
            readers.setdefault(r, []).append(i)
    end_only = [False] * n
    for i in range(n - 1, b - 1, -1):
        rs = readers.get(s.steps[i], ())
        end_only[i] = all(end_only[j] for j in rs) and (bool(rs) or s.steps[i][0] in ends)
    return readers, end_only


def gradients_late(p: "Program", s: Schedule, simulated: Callable[[Schedule], Simulation],
                   sim: Simulation | None = None) -> tuple[Schedule, Simulation]:
    """``s`` with ops of its backward whose values only the step's end reads — the gradients it returns,
    and the ops whose values nothing but such ops read (a view of a weight's gradient, the sum that makes
    a bias's) — moved from before the peak to the step's end, each with what only reads it, where the
    ``simulated`` peak (then the number of steps at it) falls; the ops making the most bytes first, one
    that does not lower it not judged again, and none judged whose move does not lower the score of
    the step without in-place writes (replayed from its lifetimes, found once a round). What a moved
    op reads is held until it runs (a linear layer's weight gradient reads the layer's input and output
    gradient, small beside the gradient itself): the simulation counts it.
    Returns the schedule and its simulation. ``s`` is taken without holds or in-place marks."""
    ends = set(p.joint.gradients)
    table = joint_table(p.joint)
    sim = simulated(s) if sim is None else sim
    judged: set[Instance] = set()
    while True:
        n, b = len(s), s.backward_start
        # each move is screened on the step without in-place writes, replayed from the lifetimes found
        # once a round (replay_moved_last); only one that lowers that score is judged by ``simulated``
        life = lifetimes(p, s)
        plain = replay(s, life)
        readers, end_only = _for_the_end(s, ends)
        last_at_peak = int(np.flatnonzero(sim.live >= sim.peak)[-1])
        made = {i: sum(int(table.size[st]) for st in table.by_name[1].get(s.steps[i][0], ()))
                for i in range(b, last_at_peak + 1) if end_only[i] and s.steps[i] not in judged}
        for i in sorted((i for i in made if made[i] > 0), key=lambda i: -made[i]):
            moved, todo = {i}, [i]
            while todo:
                for j in readers.get(s.steps[todo.pop()], ()):
                    if j not in moved:
                        moved.add(j)
                        todo.append(j)
            last = sorted(moved)
            if _score(replay_moved_last(s, life, last)) < _score(plain):
                order = [*(k for k in range(n) if k not in moved), *last]
                if _score(found := simulated(t := _in_order(s, order))) < _score(sim):
                    s, sim = t, found
                    break
            judged.add(s.steps[i])
        else:
            return s, sim


@dataclass
class _Index:
    """Where each value of a schedule is made and last read, the latest copy of each op, and the
    recomputations (node of V, copy) that :func:`~recompute.pricing.schedule.recomputation_cost` counts."""

    made: dict[Instance, int]
    last: dict[Instance, int]
    latest: dict[str, int]
    again: set[tuple[int, int]]

    @classmethod
    def of(cls, p: "Program", s: Schedule) -> "_Index":
        last: dict[Instance, int] = {}
        for j, reads in enumerate(s.reads):
            for r in reads:
                last[r] = j
        latest: dict[str, int] = {}
        for name, copy in s.steps:
            latest[name] = max(latest.get(name, 0), copy)
        again = {(p.group[name], copy) for name, copy in s.steps if copy > 0 and name in p.group}
        return cls({x: i for i, x in enumerate(s.steps)}, last, latest, again)


def _products(node: "torch.fx.Node") -> bool:
    """Whether ``node`` is an op whose work grows faster than its output (a matrix product, attention,
    a convolution: what ``torch.utils.flop_counter`` has a formula for)."""
    return getattr(node.target, "_overloadpacket", None) in flop_registry


Chain = list[tuple[Instance, tuple[Instance, ...]]]  # new op instances and what each reads, in order


def _chain(p: "Program", s: Schedule, ix: _Index, inst: Instance, at: int, max_ops: int) -> Chain | None:
    """The ops that compute ``inst`` anew right before step ``at`` (see :func:`computed_again`)."""
    added: dict[Instance, Instance] = {}
    bumped: dict[str, int] = {}
    chain: Chain = []
    started = [0]  # ops begun, their inputs first: the chain's length once done

    def again(x: Instance) -> Instance | None:
        if x in added:
            return added[x]
        if x != inst and (x not in ix.made or ix.last.get(x, -1) >= at or not _again_allowed(p, x[0])):
            return x
        # an op outside V (a mask made from the inputs alone: comparisons, views, ``where``) does not
        # count: such chains are long, but only products and convolutions take time there
        started[0] += x[0] in p.group or _products(p.joint.node(x[0]))
        if started[0] > max_ops:
            return None
        reads = []
        for r in s.reads[ix.made[x]]:
            if (y := again(r)) is None:
                return None
            reads.append(y)
        bumped[x[0]] = bumped.get(x[0], ix.latest[x[0]]) + 1
        added[x] = (x[0], bumped[x[0]])
        chain.append((added[x], tuple(reads)))
        return added[x]

    return chain if _again_allowed(p, inst[0]) and again(inst) is not None else None


def _with_chain(s: Schedule, inst: Instance, at: int, chain: Chain) -> Schedule:
    """``s`` with ``chain`` run right before step ``at``, whose reads of ``inst`` read its last op: in the
    forward phase where ``at`` is in it (the backward starts that many steps later)."""
    new = chain[-1][0]
    blk = [s.block[at]] * len(chain) if s.block else []
    return Schedule(steps=[*s.steps[:at], *(x for x, _ in chain), *s.steps[at:]],
                    reads=[*s.reads[:at], *(r for _, r in chain),
                           *(tuple(new if r == inst else r for r in reads) if inst in reads else reads
                             for reads in s.reads[at:])],
                    backward_start=s.backward_start + (len(chain) if at < s.backward_start else 0),
                    block=[*s.block[:at], *blk, *s.block[at:]] if s.block else [])


def computed_again(p: "Program", s: Schedule, inst: Instance, at: int, max_ops: int = 8) -> Schedule | None:
    """``s`` with ``inst`` computed anew right before step ``at`` and read as that copy from ``at`` on;
    what the new copy reads is read as it stands where something at or after ``at`` reads it anyway
    (or it is a placeholder or constant, or cannot run again), else computed anew in turn. None where
    that takes more than ``max_ops`` ops or ``inst`` cannot run again."""
    chain = _chain(p, s, _Index.of(p, s), inst, at, max_ops)
    return None if chain is None else _with_chain(s, inst, at, chain)


def _waiting(s: Schedule, ix: _Index, peak_step: int) -> list[tuple[Instance, int]]:
    """(value, its next read) for each value made before ``peak_step``, read after it and not at it."""
    at_peak = {*s.reads[peak_step], s.steps[peak_step]}
    nxt: dict[Instance, int] = {}
    for j in range(peak_step + 1, len(s)):
        for r in s.reads[j]:
            nxt.setdefault(r, j)
    return [(x, j) for x, j in nxt.items() if ix.made.get(x, peak_step) < peak_step and x not in at_peak]


def _unchanged_score(p: "Program", s: Schedule, ix: _Index, sim: Simulation) -> Callable[[Instance, int], bool]:
    """Whether computing ``inst`` anew before step ``at`` certainly leaves the step's score (its peak,
    the number of steps at it) as it is, so that the search need not judge it. So it is where ``inst``
    lives in no storage the step counts (a view of a parameter: nothing is freed), and where the copy
    runs after the last step at the peak and every storage ``inst`` lives in is read until that step
    through another value made by the peak (an alias), so it stays alive through it: the steps up to it
    then hold what they held (their in-place writes too: no storage's last use moves to one of them, and
    where the alias's last read is that step, its op is one that never writes in place)."""
    last_at_peak = int(np.flatnonzero(sim.live >= sim.peak)[-1])
    life = lifetimes(p, s)
    until = last_at_peak + (s.steps[last_at_peak][0] in writers(p.joint))
    readers: dict[tuple[int, int], set[Instance]] = {}  # storage → values made by the peak, read until ``until``
    for x, step in ix.last.items():
        if step >= until and ix.made.get(x, sim.peak_step + 1) <= sim.peak_step:
            for st in life.storages(x):
                readers.setdefault(st, set()).add(x)

    def unchanged(inst: Instance, at: int) -> bool:
        storages = life.storages(inst)
        return not storages or at > last_at_peak and all(readers.get(st, set()) - {inst} for st in storages)

    return unchanged


def recompute_at_peak(g: "Graph", s: Schedule, *, limit: float = math.inf, max_ops: int = 8,
                      simulated: Callable[[Schedule], Simulation] | None = None, target: int = 0) -> Schedule:
    """``s`` with recomputations sunk to their readers, values waiting across the peak computed
    again after it and gradients made after it, while that lowers the peak, the peak is above
    ``target`` bytes and the added recomputation stays within ``limit`` of Σ T_v (see the module
    docstring); ``s`` without its holds where nothing lowers it.
    ``simulated``: the simulation the peaks are judged by (default :func:`recompute.pricing.simulate.simulate`;
    for a step run in place, the simulation of the schedule :func:`recompute.rewrites.inplace.in_place` makes)."""
    p = g.program
    judge = simulated or (lambda schedule: simulate(p, schedule))
    s = replace(s, release={}, into={}) if s.release or s.into else s
    start = recomputation_cost(g, s)
    sim = judge(s)
    if _score(settled := judge(t := sunk(p, s))) <= _score(sim):
        s, sim = t, settled
    s, sim = gradients_late(p, s, judge, sim)
    table = joint_table(p.joint)
    while sim.peak > target:
        ix = _Index.of(p, s)
        spent = sum(int(g.time[v]) for v, _ in ix.again)
        tried = []
        unchanged = _unchanged_score(p, s, ix, sim)
        for inst, at in _waiting(s, ix, sim.peak_step):
            if unchanged(inst, at):
                continue
            chain = _chain(p, s, ix, inst, at, max_ops)
            if chain is None:
                continue
            added = {(p.group[x[0]], x[1]) for x, _ in chain if x[0] in p.group} - ix.again
            cost = sum(int(g.time[v]) for v, _ in added)
            if spent + cost - start > limit:
                continue
            kept = sum(int(table.size[st]) for st in table.by_name[1].get(inst[0], ()))
            tried.append((kept / max(cost, 1), inst, at, chain))
        for *_, inst, at, chain in sorted(tried, key=lambda x: -x[0]):
            if _score(found := judge(t := _with_chain(s, inst, at, chain))) < _score(sim):
                s, sim = t, found
                if _score(settled := judge(t := sunk(p, s))) < _score(sim):
                    s, sim = t, settled
                break
        else:
            t, found = gradients_late(p, s, judge, sim)
            if _score(found) >= _score(sim):
                return s
            s, sim = t, found
    return s


def needed_splits(p: "Program", s: Schedule, simulated: Callable[[Schedule], Simulation]) -> frozenset[str]:
    """The ``convolution_backward`` nodes split in ``p``'s joint graph whose split the peak of schedule
    ``s`` needs: run fused — the input's gradient made right after the weight's, the input held until
    then (or, where the weight's gradient is made late, :func:`gradients_late`, that gradient made with the
    input's) — its ``simulated`` peak would rise. Trace again with ``split_convolutions=`` these names and
    the others run as the one fused op, which is faster. A split whose fused op's extra values (the input
    and input gradient, or the weight gradient made early), added to the step's memory everywhere
    between the two ops, stay within the peak is not simulated."""
    joint, table = p.joint, joint_table(p.joint)
    where = {inst: i for i, inst in enumerate(s.steps)}
    sim = simulated(s)

    def size(name: str) -> int:
        return sum(int(table.size[st]) for st in table.by_name[1].get(name, ()))

    needed = set()
    for i, (name, copy) in enumerate(s.steps):
        origin = joint.node(name).meta.get(SPLIT_FROM)
        if origin is None:
            continue
        j = where[(origin, copy)]
        first, then = min(i, j), max(i, j)
        extra = size(joint.node(origin).args[1].name) + size(name) if j < i else size(origin)
        if int(sim.live[first:then + 1].max()) + extra <= sim.peak:
            continue
        order = [k for k in range(len(s)) if k != then]
        order.insert(order.index(first) + 1, then)
        reads = list(s.reads)
        reads[i] = (*s.reads[i], *s.reads[j])  # the fused op reads the input too
        fused = replace(s, steps=[s.steps[k] for k in order], reads=[reads[k] for k in order],
                        block=[s.block[k] for k in order] if s.block else [], release={}, into={})
        if simulated(fused).peak > sim.peak:
            needed.add(origin)
    return frozenset(needed)
