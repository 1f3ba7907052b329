"""Cheap rematerialization: a schedule keeps fewer bytes by recomputing pointwise ops in the backward.

The lower sets of the DPs cut the graph between nodes of V; what a block caches is its boundary
∂(L_i), and what the backward reads of the forward pass is kept whole. On a decomposed graph (the
joint graph ``torch.compile`` hands a partitioner) one convolution's output is followed by a chain
of pointwise ops — BatchNorm's normalisation, its affine map, ReLU — whose outputs the backward
reads too: keeping the convolution's output and recomputing the chain from it costs a few
elementwise passes and saves one tensor per op of the chain.

:func:`rematerialize` chooses, for a given schedule, the set of forward values to keep that costs
the fewest bytes, such that every forward value its backward phase reads is either kept or can be
recomputed from kept values (and parameters, inputs, constants) by :func:`cheap` ops alone. That is
a minimum s–t cut: each forward value u is an edge u_in → u_out whose capacity is the bytes it keeps
alive (cutting it: keep u); a data edge a_out → u_in and an edge from the source into every op that
must not be recomputed (a convolution, a reduction, a random op) cannot be cut; every value the
backward reads drains into the sink. A cheap op's own edge from the source, of capacity ``weight`` ×
the bytes it writes, is the price of recomputing it: with weight 0 recomputation is free and only
bytes count; a weight w recomputes an op only where that saves more than w bytes per byte written
(where the graph was priced by measured seconds: per byte-equivalent of its seconds at the ops'
average rate, so that of two ops that keep as much the faster is recomputed first). Nodes on the
sink side are recomputed in the backward, right before the first read in each block,
and dropped after their last.

The cut also runs the other way: a backward op that reads no gradient — ReLU's mask ``relu <= 0``,
a function of forward values alone — may run in the forward phase instead, right after what it
reads, and its output be kept in place of its operands (a bool mask is a quarter of the float32
ReLU output it replaces where nothing else of the backward reads that output: before each of
VGG's max-pools). Such an op is a value of the cut like a forward one, except that leaving it in the
backward is free (that is where it runs), so keeping it is chosen only where it keeps fewer bytes.

Inside the backward phase, :func:`recompute_late` shortens what a recomputed block holds: where the
block recomputes its convolutions, each layer's cheap chain (concatenation, normalisation, ReLU) is
read by the recomputed convolution and again, much later, by that layer's backward; it is computed a
third time right before the later read instead of being held in between (DenseNet-161: docs/library.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Set

import torch
import torch.fx as fx

from recompute.core.fxnodes import runs_once
from recompute.rewrites.inplace import simulated_in_place
from recompute.pricing.schedule import Instance, Schedule
from recompute.pricing.simulate import Simulation, simulate
from recompute.core.storage import joint_table

if TYPE_CHECKING:
    from recompute.capture.trace import Program

__all__ = ["cheap", "cheapest_kept", "recompute_late", "late_where_needed", "rematerialize"]

# ops a partitioner may run again in the backward at the cost of one pass over their operands; the
# last turns inductor's int8 max-pool offsets into the int64 indices max-pool's backward reads, and
# ``_unsafe_index`` is the gather an upsampling decomposes into (U-Net's decoder). By name: inductor
# registers its prim only when imported, which takes seconds (recompute is imported by every process)
_CHEAP = {"aten::cat", "aten::clone", "aten::_to_copy", "aten::constant_pad_nd",
          "prims::_low_memory_max_pool_offsets_to_indices", "aten::_unsafe_index"}


def cheap(node: fx.Node) -> bool:
    """Whether ``node`` may be recomputed in the backward at the cost of a pass over its operands: a
    view or a pointwise op (or a concatenation, a copy, a padding, max-pool's indices) of one tensor
    output that neither draws random numbers nor writes into its inputs."""
    t = node.target
    if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return False
    if runs_once(node) or not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    return t.is_view or torch.Tag.pointwise in t.tags or t.name().partition(".")[0] in _CHEAP


def rematerialize(p: "Program", s: Schedule, weight: float = 0.0) -> Schedule:
    """``s`` with the forward values its backward phase reads replaced, where that keeps fewer bytes,
    by recomputations of :func:`cheap` ops (see the module docstring). Each recomputation reads what
    its forward step read, recomputed in turn where that was; a forward op that then has no reader
    left in the step (max-pool's indices, which only its backward reads) no longer runs in the forward
    phase: it is moved, not repeated. ``weight`` prices a recomputation in kept bytes per byte it
    writes: 0 recomputes wherever that keeps fewer bytes, a larger weight only where it keeps many."""
    forward = {s.steps[i][0]: i for i in range(s.backward_start)}
    early = _gradient_free(p, s, forward)
    needed = list(dict.fromkeys(r[0] for i in range(s.backward_start, len(s)) if s.steps[i][0] not in early
                                for r in s.reads[i] if r[1] == 0 and (r[0] in forward or r[0] in early)))
    again, moved = _recomputed(p, s, forward, early, set(needed), weight)
    if not again and not moved:
        return s
    steps, reads, block = _forward_with(s, sorted(early[name] for name in moved), forward)
    backward_start = len(steps)
    latest: dict[str, int] = {}  # the highest copy of each op in s
    for name, copy in s.steps:
        latest[name] = max(latest.get(name, 0), copy)
    here: dict[str, Instance] = {}  # recomputed in the current block
    current = None

    def ensure(name: str, blk: int) -> Instance:
        if name in here:
            return here[name]
        fwd = forward[name]
        step_reads = tuple(ensure(r[0], blk) if r[0] in again and r[1] == 0 else r for r in s.reads[fwd])
        latest[name] += 1
        inst = (name, latest[name])
        steps.append(inst)
        reads.append(step_reads)
        block.append(blk)
        here[name] = inst
        return inst

    for i in range(s.backward_start, len(s)):
        if s.steps[i][0] in moved:
            continue
        blk = s.block[i] if s.block else 0
        if blk != current:
            current, here = blk, {}
        step_reads = tuple(ensure(r[0], blk) if r[1] == 0 and r[0] in again else r for r in s.reads[i])
        steps.append(s.steps[i])
        reads.append(step_reads)
        block.append(blk)
    return _without_dead_forward(p, Schedule(steps=steps, reads=reads, backward_start=backward_start, block=block))


def _gradient_free(p: "Program", s: Schedule, forward: Mapping[str, int]) -> dict[str, int]:
    """The backward steps of ``s`` that could run in its forward phase, by name (each is a first and
    only copy) → step index: :func:`cheap` ops of the backward that read no gradient (no tangent, in
    the joint graph) and only forward values as the forward phase computes them, or other such steps;
    none reads a buffer the step writes (in the forward phase it would read the old value)."""
    joint = p.joint
    written = set(joint.buffer_writes.values())
    graded = set(joint.tangents)
    for x in joint.gm.graph.nodes:
        if any(a.name in graded for a in x.all_input_nodes):
            graded.add(x.name)
    found: dict[str, int] = {}
    for i in range(s.backward_start, len(s)):
        name, copy = s.steps[i]
        if copy == 0 and name not in forward and name not in graded and cheap(joint.node(name)) and s.reads[i] \
                and all(r[1] == 0 and (r[0] in found or (r[0] in forward and r[0] not in written)) for r in s.reads[i]):
            found[name] = i
    return found


def _forward_with(s: Schedule, moved: Sequence[int], forward: Mapping[str, int]) -> tuple[list[Instance], list, list[int]]:
    """The forward phase of ``s`` with backward steps ``moved`` (indices, in step order) run in it, each
    right after the last forward step it reads, so that what it reads is not held any longer."""
    block = list(s.block) if s.block else [0] * len(s)
    order = [(i, 0, i) for i in range(s.backward_start)]
    after: dict[Instance, int] = {}
    for i in moved:
        at = max((forward[r[0]] if r[1] == 0 and r[0] in forward else after.get(r, -1) for r in s.reads[i]), default=-1)
        after[s.steps[i]] = at
        order.append((at, 1, i))
    order.sort()
    return ([s.steps[i] for _, _, i in order], [s.reads[i] for _, _, i in order],
            [block[i] if j == 0 else block[max(at, 0)] for at, j, i in order])


def _without_dead_forward(p: "Program", s: Schedule) -> Schedule:
    """``s`` without the forward steps whose value no step reads, the step returns or whose effect
    (a random draw, a write into an input) must happen. Values die after their last read (the split
    drops them there, as the modules that run do), so the schedule has no release points."""
    joint = p.joint
    output = joint.gm.graph.find_nodes(op="output")[0]
    # what the step returns: the joint module's outputs, and (a traced step's) the model's outputs and
    # BatchNorm's new statistics, which the executor hands back beside them
    returned = {x.name for x in output.all_input_nodes} | {x.name for x in joint.user_outputs} | set(joint.buffer_writes)
    read: set[Instance] = set()
    keep = [True] * len(s)
    for i in range(len(s) - 1, -1, -1):
        name, copy = s.steps[i]
        node = joint.node(name)
        if i < s.backward_start and (name, copy) not in read and name not in returned \
                and node.op == "call_function" and not runs_once(node):
            keep[i] = False
            continue
        read.update(s.reads[i])
    idx = [i for i in range(len(s)) if keep[i]]
    return Schedule(steps=[s.steps[i] for i in idx], reads=[s.reads[i] for i in idx],
                    backward_start=sum(keep[:s.backward_start]), block=[s.block[i] for i in idx])


def cheapest_kept(size: Mapping[str, int], inputs: Mapping[str, Sequence[str]], recomputable: Mapping[str, float],
                  needed: Set[str]) -> tuple[set[str], set[str]]:
    """The values to keep and the values to recompute, at the least cost, so that every value in
    ``needed`` is kept or recomputed, and every recomputed value is ``recomputable`` and reads only kept
    or recomputed values (see the module docstring: a minimum s–t cut). ``size`` names every value (a
    value absent from it, such as a parameter, is always at hand) and what keeping it costs;
    ``recomputable`` what recomputing each such value costs (in the same unit); ``inputs`` what each
    reads."""
    import networkx as nx  # here: its import (~0.4 s) is paid by the runs that rematerialize, not by `import recompute`

    flow = nx.DiGraph()
    flow.add_nodes_from(["source", "sink"])
    for name, nbytes in size.items():
        flow.add_edge((name, "in"), (name, "out"), capacity=nbytes)
        if name not in recomputable:
            flow.add_edge("source", (name, "in"))
        elif recomputable[name] > 0:
            flow.add_edge("source", (name, "in"), capacity=recomputable[name])
        for a in inputs.get(name, ()):
            if a in size:
                flow.add_edge((a, "out"), (name, "in"))
    for name in needed:
        flow.add_edge((name, "out"), "sink")
    _, (source_side, sink_side) = nx.minimum_cut(flow, "source", "sink")
    kept = {name for name in size if (name, "in") in source_side and (name, "out") in sink_side}
    return kept, {name for name in size if (name, "in") in sink_side}


def _recomputed(p: "Program", s: Schedule, forward: dict[str, int], early: Mapping[str, int], needed: set[str],
                weight: float) -> tuple[set[str], set[str]]:
    """The forward values of ``s`` the minimum cut recomputes, and the backward steps among ``early``
    it runs in the forward phase instead; a value costs the bytes of the storages a read of it keeps
    alive (the parameters' and the inputs' not counted), a recomputation ``weight`` × the bytes it
    writes, except where the forward phase computes the value only for the backward: then it is
    moved, which costs nothing. An ``early`` step left in the backward costs nothing either. Where
    the program's ops were timed (the ``measured`` cost model), a recomputation costs its seconds
    instead, in bytes at the ops' average rate (:func:`_price`)."""
    joint = p.joint
    table = joint_table(joint)
    written = set(joint.buffer_writes.values())
    given = {st for x in joint.gm.graph.nodes if x.op in ("placeholder", "get_attr") for st in table.made.get(x, ())}
    size: dict[str, int] = {}
    for name in [*forward, *early]:
        kept = sum(int(table.size[st]) for st in table.of.get(joint.node(name), ()) if st not in given)
        # ties: keep a value the backward reads rather than what it is computed from, and a forward value
        # rather than a backward op run early (which would then compute in the forward for nothing)
        size[name] = kept + (name not in needed) + 2 * (name in early)
    inputs = {name: [r[0] for r in s.reads[i]] for name, i in [*forward.items(), *early.items()]}
    # the values the forward phase needs for itself: what the step returns, what the ops that stay in
    # the forward read (those that must run once or are not cheap), and what those read in turn
    # (forward is in step order, so a value's readers are seen before it)
    output = joint.gm.graph.find_nodes(op="output")[0]
    used = {x.name for x in output.all_input_nodes}
    for name in reversed(forward):
        node = joint.node(name)
        if name in used or runs_once(node) or not cheap(node):
            used.update(inputs[name])
    # an op that reads a buffer the step writes is not recomputed: it would read the new value
    candidates = [name for name in forward if cheap(joint.node(name)) and not written.intersection(inputs[name])]
    price = _price(p, candidates)
    recomputable = {name: weight * price[name] * (name in used) for name in candidates}
    recomputable.update(dict.fromkeys(early, 0.0))
    again = cheapest_kept(size, inputs, recomputable, needed)[1]
    return again - early.keys(), early.keys() - again


def _price(p: "Program", names: Sequence[str]) -> dict[str, float]:
    """What recomputing each op costs, in bytes it writes: where the graph was priced by measured
    seconds (``p.op_seconds``), an op's seconds at the timed ops' average bytes per second (so a weight
    means the same on average, and of two ops of one size the faster is recomputed first); else, and
    for an op not timed (outside V), the bytes it writes."""
    nbytes = {name: float(_written(p.joint.node(name))) for name in names}
    timed = [name for name in names if name in p.op_seconds]
    seconds = sum(p.op_seconds[name] for name in timed)
    if seconds <= 0:
        return nbytes
    rate = sum(nbytes[name] for name in timed) / seconds
    return {**nbytes, **{name: p.op_seconds[name] * rate for name in timed}}


def _written(node: fx.Node) -> int:
    """Bytes an op writes: its output's (a view writes nothing)."""
    val = node.meta["val"]
    return 0 if node.target.is_view else val.numel() * val.element_size()


def recompute_late(p: "Program", s: Schedule, min_gap: int = 8, only: Set[Instance] | None = None) -> Schedule:
    """``s`` with each :func:`cheap` value its backward phase recomputes and reads early and again more
    than ``min_gap`` steps later (a ReLU output a recomputed convolution reads, whose backward reads it
    again only when its turn comes) computed once more right before the later reads instead of held in
    between. What the new copy reads is taken as it stands, or recomputed in turn where it is cheap and
    nothing reads it from there on (BatchNorm's normalisation chain back to the concatenation it
    normalises). Every read still follows the step that makes what it reads. ``only``: the values
    computed once more are among these (None: any)."""
    joint = p.joint
    b = s.backward_start
    readers: dict[Instance, list[int]] = {}
    for i in range(b, len(s)):
        for r in s.reads[i]:
            readers.setdefault(r, []).append(i)
    made = {inst: i for i, inst in enumerate(s.steps)}
    latest: dict[str, int] = {}
    for name, copy in s.steps:
        latest[name] = max(latest.get(name, 0), copy)
    before: dict[int, list[tuple[Instance, tuple[Instance, ...]]]] = {}  # position → steps inserted there
    moved: dict[tuple[int, Instance], Instance] = {}  # (reading step, old instance) → new instance
    for i in range(b, len(s)):
        inst = s.steps[i]
        if inst[1] == 0 or not cheap(joint.node(inst[0])) or (only is not None and inst not in only):
            continue
        at = readers.get(inst, [])
        gaps = [(at[j] - at[j - 1], j) for j in range(1, len(at))]
        if not gaps or max(gaps)[0] <= min_gap:
            continue
        late = at[max(gaps)[1]]
        added: dict[Instance, Instance] = {}

        def again(x: Instance) -> Instance:  # x computed anew right before step ``late``
            if x in added:
                return added[x]
            step = made[x]
            reads = tuple(again(r) if r[1] > 0 and cheap(joint.node(r[0]))
                          and max(readers.get(r, [0])) < late else r for r in s.reads[step])
            latest[x[0]] += 1
            added[x] = (x[0], latest[x[0]])
            before.setdefault(late, []).append((added[x], reads))
            return added[x]

        new = again(inst)
        for j in at:
            if j >= late:
                moved[(j, inst)] = new
    if not before:
        return s
    steps, reads, block = list(s.steps[:b]), list(s.reads[:b]), list(s.block[:b]) if s.block else []
    at = list(range(b))  # old step index → new
    rereads = {i for i, _ in moved}
    for i in range(b, len(s)):
        for inst, r in before.get(i, ()):
            steps.append(inst)
            reads.append(r)
            block.extend([s.block[i]] if s.block else [])
        at.append(len(steps))
        steps.append(s.steps[i])
        reads.append(tuple(moved.get((i, r), r) for r in s.reads[i]) if i in rereads else s.reads[i])
        block.extend([s.block[i]] if s.block else [])
    return Schedule(steps=steps, reads=reads, backward_start=b, block=block,
                    release={at[i]: insts for i, insts in s.release.items()})


def late_where_needed(p: "Program", s: Schedule, min_gap: int = 8, written_in_place: bool = False,
                      as_planned: Schedule | None = None) -> Schedule:
    """:func:`recompute_late` with only the values its peak needs computed once more (``s`` itself where
    it does not lower the peak). A recomputation costs a pass over its operands, and most lie where the
    step is far below its peak: of the 190 that DenseNet-161's memory-centric DP's smallest plan (batch
    32, 224²) would add, 35 give the same peak. Runs of the candidates are left held where the
    simulated peak does not rise without them, and a run that does rise is halved and tried again
    (one simulation per run). The candidates are ordered by what the step with every late
    recomputation holds at most while the value would wait, plus its bytes: those far below the peak
    come first and are left held together in few runs, those near it, which the peak needs, last
    (that plan: 181 simulations, against 217 with the candidates in schedule order).

    ``written_in_place``: for a step run in place (:func:`recompute.rewrites.inplace.in_place`), where the peak
    sits elsewhere and needs other recomputations. The search is run judging the peaks of the
    schedules run in place, and as planned, and of the two (and ``s``) the one whose step in place
    holds least is kept, the fewer recomputations on a tie: neither search always finds the least
    (``tests/test_refine.py`` has a network where each wins). ``as_planned``: the search's result judged as
    planned, where the caller has it (it is not searched again).
    """
    if as_planned is None:
        as_planned = _fewest_late(p, s, min_gap, lambda schedule: simulate(p, schedule))
    if not written_in_place:
        return as_planned

    placed = simulated_in_place(p)
    found = [s, _fewest_late(p, s, min_gap, placed), as_planned]
    return min(found, key=lambda x: (placed(x).peak, len(x)))


def _fewest_late(p: "Program", s: Schedule, min_gap: int, simulated: Callable[[Schedule], Simulation]) -> Schedule:
    """The search of :func:`late_where_needed`, with the peaks ``simulated`` gives."""
    full = recompute_late(p, s, min_gap)
    if full is s or (peak := (curve := simulated(full)).peak) >= simulated(s).peak:
        return s
    # in the step with every late recomputation, a value waits from where it is made to where its
    # next copy is (a value not moved has none: it waits nowhere); held there, it adds its bytes
    where: dict[str, list[int]] = {}
    for i, (name, _) in enumerate(full.steps):
        where.setdefault(name, []).append(i)
    made = {inst: i for i, inst in enumerate(full.steps)}

    def waiting(inst: Instance) -> int:
        later = [j for j in where[inst[0]] if j > made[inst]]
        return int(curve.live[made[inst]:later[0]].max()) + _written(p.joint.node(inst[0])) if later else 0

    candidates = sorted((inst for inst in s.steps[s.backward_start:] if inst[1] > 0 and cheap(p.joint.node(inst[0]))),
                        key=waiting)
    kept, best, runs = set(candidates), full, [candidates]
    while runs:
        run = runs.pop()
        fewer = kept.difference(run)
        if simulated(schedule := recompute_late(p, s, min_gap, fewer)).peak <= peak:
            kept, best = fewer, schedule
        elif len(run) > 1:
            runs += [run[len(run) // 2:], run[:len(run) // 2]]
    return best
