"""Schedules: the program a plan runs, as ordered op instances of the joint graph.

A :class:`Schedule` lists instances of the joint graph's ops (:mod:`recompute.capture.joint`). An instance is
``(fx node name, copy)``: copy 0 is the op as the forward pass computes it, copy ≥ 1 a recomputation
of a forward op in the backward phase (a schedule may recompute a value more than once). Every value
dies after its last use, or after ``release`` where a schedule keeps it longer on purpose.

:func:`canonical` compiles a lower-set sequence L_1 ≺ … ≺ L_k = V into the canonical strategy of
Kusumoto et al. (2019, §3): the forward pass computes V block by block (:func:`forward_order`: random
ops draw from the generator in the same order as plain training) and keeps the boundaries ∂(L_i)
(and, as autograd would, what the last block's backward reads); then for i = k, …, 1 the backward
phase recomputes V_i \\ ∂(L_i) from the cache (those of its ops whose results something reads),
runs the backward ops of V_i, and lets the cached ∂(L_i) go. Cached values are kept until their own
block's backward is done even where the last reader ran earlier: that is what makes the memory of
block i depend only on (L_{i-1}, L_i) and the cache M(U_{i-1}), the structure the DP exploits
(:mod:`recompute.pricing.blockcost`). For the same reason the prologue's values and BatchNorm's new
statistics are held to the end of the step.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch.fx as fx

from recompute.core import lowerset
from recompute.core.fxnodes import is_random, output_tensors, runs_once
from recompute.core.storage import is_alias

if TYPE_CHECKING:
    from recompute.core.graph import Graph
    from recompute.capture.joint import JointProgram
    from recompute.capture.trace import Program

__all__ = ["Instance", "Schedule", "Writer", "canonical", "forward_order", "rng_order_preds", "held", "recomputation_cost"]

Instance = tuple[str, int]


def held(node: fx.Node, joint: "JointProgram") -> bool:
    """Whether the canonical schedule holds this member of a cached node until its block's backward:
    every member but BatchNorm's new statistics (held to the end of the step anyway) and a
    multi-output op as a whole (its elements are held through their ``getitem``s, so an element
    nothing reads is not kept)."""
    if node.name in joint.buffer_writes:
        return False
    return is_alias(node) or len(output_tensors(node.meta.get("val"))) <= 1


@dataclass
class Schedule:
    """An ordered list of op instances of one joint graph.

    Attributes:
        steps: the op instances in execution order.
        reads: for each step, the instances of its fx inputs it reads (placeholders have copy 0).
        backward_start: index of the first step of the backward phase (tangents arrive there).
        release: step index → instances that may die after it at the earliest (values kept on
            purpose beyond their last use).
        block: for each step, the block (1-based, the forward ones too) it belongs to; 0 for the
            prologue.
        into: step → the instance it reads whose storage its op writes its output into (in place,
            :mod:`recompute.rewrites.inplace`); every other step allocates its outputs.
    """

    steps: list[Instance]
    reads: list[tuple[Instance, ...]]
    backward_start: int
    release: dict[int, list[Instance]] = field(default_factory=dict)
    block: list[int] = field(default_factory=list)
    into: dict[int, Instance] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.steps)

    def names(self) -> set[str]:
        """The ops it runs and the values it reads, by name."""
        return {name for name, _ in self.steps} | {name for read in self.reads for name, _ in read}

    def recomputations(self) -> int:
        """How many op instances run more than once."""
        return sum(1 for _, copy in self.steps if copy > 0)


class Writer:
    """Writes a schedule op by op: every op reads the latest copy of each of its inputs, and a forward
    op written again (``new=True``) becomes its next copy, a recomputation."""

    def __init__(self) -> None:
        self.steps: list[Instance] = []
        self.reads: list[tuple[Instance, ...]] = []
        self.block: list[int] = []
        self.latest: dict[str, int] = {}

    def emit(self, node: fx.Node, blk: int, new: bool) -> None:
        copy = self.latest[node.name] + 1 if new and node.name in self.latest else 0
        self.reads.append(tuple((a.name, self.latest.get(a.name, 0)) for a in node.all_input_nodes))
        self.steps.append((node.name, copy))
        self.block.append(blk)
        self.latest[node.name] = copy

    def schedule(self, backward_start: int) -> Schedule:
        return Schedule(steps=self.steps, reads=self.reads, backward_start=backward_start, block=self.block)


def forward_order(g: "Graph", seq: Sequence[frozenset[int]]) -> list[fx.Node]:
    """The forward phase: block by block, each in the traced order — unless that would change the
    order in which random ops draw from the generator (dropouts in parallel branches split across
    blocks), then the whole forward in the traced order, so that masks equal plain training's. The
    DPs plan over lower sets that keep random ops in the traced order (:func:`rng_order_preds`), whose
    forward phase is block by block."""
    p: Program = g.program
    block_of = {v: i for i, b in enumerate(lowerset.blocks(seq)) for v in b}
    traced = [n for n in p.joint.forward if n.name in p.group]
    by_block = sorted(traced, key=lambda n: block_of[p.group[n.name]])  # stable: traced order inside a block
    random = [n for n in traced if is_random(n)]
    return by_block if [n for n in by_block if is_random(n)] == random else traced


def rng_order_preds(g: "Graph") -> tuple[tuple[int, ...], ...]:
    """δ⁻ of every node plus, for each random node of V, the random node traced before it: lower sets
    of this order are the ones whose blocks keep the generator's draws in the traced order."""
    if g.program is None:
        return g.preds
    p: Program = g.program
    randoms = [p.group[n.name] for n in p.joint.forward if n.name in p.group and is_random(n)]
    extra = {v: u for u, v in zip(randoms, randoms[1:]) if u != v}
    return tuple(tuple(sorted(set(ps) | ({extra[v]} if v in extra else set()))) for v, ps in enumerate(g.preds))


def recomputation_cost(g: "Graph", schedule: Schedule) -> int:
    """Σ T_v over every recomputation of a node v of V (each copy ≥ 1 of its ops counts once)."""
    again = {(g.program.group[name], copy) for name, copy in schedule.steps if copy > 0 and name in g.program.group}
    return int(sum(g.time[v] for v, _ in again))


def canonical(g: "Graph", seq: Sequence[frozenset[int]]) -> Schedule:
    """The canonical strategy of the lower-set sequence ``seq`` (see the module docstring)."""
    p: Program = g.program
    joint = p.joint
    blocks = lowerset.blocks(seq)
    k = len(blocks)
    block_of = {v: i for i, b in enumerate(blocks, 1) for v in b}
    recomputed: dict[int, frozenset[int]] = {
        i: blocks[i - 1] - lowerset.boundary(g, frozenset(seq[i - 1])) for i in range(1, k)
    }
    steps: list[Instance] = []
    reads: list[tuple[Instance, ...]] = []
    where: list[int] = []

    def emit(node: fx.Node, copy: int, blk: int, fresh: frozenset[int]) -> None:
        """Append ``node``; an input whose node of V is in ``fresh`` is read as recomputed."""
        steps.append((node.name, copy))
        reads.append(tuple((a.name, 1 if p.group.get(a.name) in fresh else 0) for a in node.all_input_nodes))
        where.append(blk)

    for node in p.prologue:
        emit(node, 0, 0, frozenset())
    by_block: dict[int, list[fx.Node]] = {i: [] for i in range(1, k + 1)}
    for node in joint.forward:
        if node.name in p.group:
            by_block[block_of[p.group[node.name]]].append(node)
    for node in forward_order(g, seq):
        emit(node, 0, block_of[p.group[node.name]], frozenset())
    backward_start = len(steps)
    owned: dict[int, list[fx.Node]] = {i: [] for i in range(1, k + 1)}
    blk_of: dict[str, int] = {}
    for node in joint.backward:
        v = p.owner.get(node.name)
        blk = block_of[v] if v is not None else k
        # never before a gradient it reads (blocks run k, …, 1): guards an owner the alignment missed
        blk = min([blk, *(blk_of[a.name] for a in node.all_input_nodes if a.name in blk_of)])
        blk_of[node.name] = blk
        owned[blk].append(node)
    release: dict[int, list[Instance]] = {}
    for i in range(k, 0, -1):
        fresh = recomputed.get(i, frozenset())
        for node in by_block[i]:
            if p.group[node.name] in fresh:
                emit(node, 1, i, fresh)
        for node in owned[i]:
            emit(node, 0, i, fresh)
        if i < k:  # the cached boundary ∂(L_i) is kept until here
            cached = blocks[i - 1] - fresh
            # (a block without steps releases where the block above ended)
            release.setdefault(len(steps) - 1, []).extend(
                (n.name, 0) for v in cached for n in p.members[v] if held(n, joint))
    # the prologue's values (computed from parameters and buffers alone) and BatchNorm's new statistics
    # (which BatchNorm's backward reads) are held to the end: a few bytes, and then no block's memory
    # depends on the blocks where their readers ran
    release.setdefault(len(steps) - 1, []).extend(
        [*((n.name, 0) for n in p.prologue if not is_alias(n)), *((name, 0) for name in joint.buffer_writes)])
    s = Schedule(steps=steps, reads=reads, backward_start=backward_start, release=release, block=where)
    return _unread_dropped(joint, s)


def _unread_dropped(joint: "JointProgram", s: Schedule) -> Schedule:
    """``s`` without the recomputations that no later step reads, directly or through another kept
    one: V_i \\ ∂(L_i) is recomputed node by node, but where a cached value stands for the ops that
    made it (a block's cached output after its BatchNorm), those ops' results are read by nothing.
    Random ops and writes run as the schedule says, and so do the ``getitem``s of a kept op. A
    release point on a dropped step moves to the kept step before it."""
    needed: set[Instance] = set()
    keep = [True] * len(s)
    for i in range(len(s) - 1, -1, -1):
        if s.steps[i][1] > 0 and s.steps[i] not in needed and not runs_once(joint.node(s.steps[i][0])):
            keep[i] = False
        else:
            needed.update(s.reads[i])
    if all(keep):
        return s
    # a kept multi-output op's elements stay with it: its tuple lives until its last getitem reads it
    kept = {inst for inst, k in zip(s.steps, keep) if k}
    for i, inst in enumerate(s.steps):
        if not keep[i] and joint.node(inst[0]).target is operator.getitem and s.reads[i][0] in kept:
            keep[i] = True
            kept.add(inst)
    position = [c - 1 for c in itertools.accumulate(keep)]  # a dropped step's: the kept one before it
    release: dict[int, list[Instance]] = {}
    for i, values in s.release.items():
        release.setdefault(position[i], []).extend(values)
    return Schedule(steps=list(itertools.compress(s.steps, keep)), reads=list(itertools.compress(s.reads, keep)),
                    backward_start=s.backward_start, release=release, block=list(itertools.compress(s.block, keep)))
