"""The MILP's prices: the data of a :class:`~recompute.planners.milp.problem.Problem` and what a
schedule (R, S) costs under it.

Pricing. The schedule that runs (:func:`.planner._schedule`) is the prologue, then stage by stage the fx ops
of the nodes R computes (in order), then in a backward stage its backward ops; the simulator frees
every storage after its last read. The program prices exactly that, from the joint program on a
traced graph:

* a (coarse) node's storages (one per output of each op of its nodes) fall in four kinds: read by
  a forward op of another node or a step output (its *forward part*, M_c bytes), else read by a
  backward op (its *saved part*, M'_c: BatchNorm's mean and inverse deviation, a max-pool's
  indices, a coarse node's inner activations), else BatchNorm's new statistics, else nothing
  outside the node (temporaries, outputs nobody reads: they die inside its computation);
* X_q at op q of c: the bytes of c's own storages alive there, each freed after its last read
  inside c (the first three kinds held to the end of c), minus M_c + M'_c (which U counts); D_{q,i}:
  the bytes of the forward part of c's input i that no op of c from q on reads;
* H_t: in forward stage t the BatchNorm statistics of the nodes before t (held to the end of the
  forward phase); in backward stage n + s the simulator's bytes of the backward values alone between
  stages (:mod:`recompute.pricing.simulate` on the backward ops in stage order, tangents from the start,
  parameter gradients to the end); in both the prologue's values;
* a backward event e is a backward op: H'_e is the backward values' bytes at it (the same
  simulation), the prologue's values and A_e + A'_e, the parts of the stage's storages read at e or
  later; the ops of a stage that leave the same storages to be read are one event (the largest).

On a graph built from edges M_v and T_v are the graph's (M'_v = X = D = 0), the backward ops of v
(one event) read δ⁻(v) ∪ {v}, and the gradient of v (M_v bytes) lives from the backward stage of its
first differentiated successor (of the backward start for an output) to the end of v's.

Where the program and the simulator can still differ. A schedule is priced at the least (S, S')
that runs it (:func:`keep`; ``Plan.model_peak``); the program never under-prices it. It
over-prices where (1) a node's forward part dies whole after the last of its forward readers in
the stage (storages of a multi-output op or of a coarse node read by different successors), (2) a
kept part is held whole although only some of its storages are read later, (3) the prologue's
values are held all step and a recomputed copy of BatchNorm statistics to the end of its node.
How far, measured on the paper's networks and on random DAGs: ``docs/planners.md``
(MILP: the program's price against the simulator's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from recompute.core.fxnodes import is_random
from recompute.core.graph import Graph
from recompute.pricing.schedule import Schedule
from recompute.pricing.simulate import simulate
from recompute.core.storage import Counted, joint_table
from recompute.planners.milp.problem import Problem, coarsen

if TYPE_CHECKING:
    from recompute.capture.trace import Program

__all__ = ["problem", "stage_memory", "keep"]


def problem(g: Graph, max_nodes: int | None = None) -> Problem:
    """The program's data for ``g`` (coarsened to ``max_nodes``), priced as the module docstring says."""
    groups = coarsen(g, max_nodes)
    n = len(groups)
    where = np.empty(g.n, dtype=np.int64)
    for c, grp in enumerate(groups):
        where[list(grp)] = c
    preds = tuple(tuple(sorted({int(where[u]) for v in grp for u in g.preds[v]} - {c})) for c, grp in enumerate(groups))
    time = np.array([int(g.time[list(grp)].sum()) for grp in groups], dtype=np.int64)
    pinned = np.zeros(n, dtype=bool)
    pinned[where[list(g.outputs)]] = True
    fixed = np.zeros(n, dtype=bool)
    common = {"groups": tuple(groups), "preds": preds, "time": time, "pinned": pinned}
    if g.program is not None:
        return _traced(g, where, fixed, common)
    mem = np.array([int(g.mem[list(grp)].sum()) for grp in groups], dtype=np.int64)
    needs = np.zeros((n, n), dtype=bool)
    for c, grp in enumerate(groups):
        needs[n - 1 - c, [c, *preds[c]]] = True
    # gradient of v: from the stage of its first differentiated successor (outputs: the start) to v's
    stage = n - 1 - where  # backward stage index s of each node of V
    born = np.array([min((stage[w] for w in g.succs[v]), default=-1) for v in range(g.n)])
    s = np.arange(n)[:, None]
    between = ((born[None, :] < s) & (s <= stage[None, :])) @ g.mem
    during = ((born[None, :] <= s) & (s <= stage[None, :])) @ g.mem
    alive = needs * mem[None, :]  # one backward event per stage: it reads all it needs
    none = np.zeros(n, dtype=np.int64)
    return Problem(mem=mem, saved=none, peak_node=np.arange(n), peak_extra=none, peak_done=np.zeros((n, n), dtype=np.int64),
                   needs=needs, needs_saved=np.zeros_like(needs),
                   base=np.concatenate([none, between]), bwd_stage=np.arange(n), bwd_base=during + alive.sum(1),
                   bwd_alive=np.hstack([alive, np.zeros_like(alive)]), fixed=fixed, **common)


def _traced(g: Graph, where: np.ndarray, fixed: np.ndarray, common: dict) -> Problem:
    """Prices from the joint program as the simulator replays the schedule ``_schedule`` writes (see
    the module docstring, Pricing)."""
    p = g.program
    joint = p.joint
    n = len(common["groups"])
    st = joint_table(joint).counted(x for members in p.members for x in members)  # V's values
    size = st.size
    node_of = np.zeros(len(size), dtype=np.int64)
    for v, members in enumerate(p.members):
        for x in members:
            node_of[st.made(x)] = v
    group = where[node_of]
    for v, nodes in enumerate(p.members):
        fixed[where[v]] |= any(is_random(x) for x in nodes)
    # backward ops by stage: their owner's, never before a gradient they read
    stage_of: dict[str, int] = {}
    for node in joint.backward:
        v = p.owner.get(node.name)
        s = n - 1 - int(where[v]) if v is not None else 0
        stage_of[node.name] = max([s, *(stage_of[a.name] for a in node.all_input_nodes if a.name in stage_of)])
    ordered = sorted(joint.backward, key=lambda x: stage_of[x.name])  # stable: run order within a stage
    stages = np.array([stage_of[x.name] for x in ordered], dtype=np.int64)
    # what outlives the computation of its group: read by another group's forward op or a step output
    # (the forward part), else by a backward op (the saved part); BatchNorm's new statistics live to
    # the end of the forward phase (H_t)
    forward = np.zeros(len(size), dtype=bool)
    for v, members in enumerate(p.members):
        for x in members:
            for e in st.reads(x):
                forward[e] |= group[e] != where[v]
    for x in p.joint.user_outputs:
        forward[st.of(x)] = True
    reads = [set(st.reads(x)) for x in ordered]
    backward = np.zeros(len(size), dtype=bool)
    for r in reads:
        backward[list(r)] = True
    saved = backward & ~forward
    stats = np.zeros(len(size), dtype=bool)
    for name in joint.buffer_writes:
        stats[st.of(joint.node(name))] = True
    mem = np.bincount(group, weights=size * forward, minlength=n).astype(np.int64)
    mem_saved = np.bincount(group, weights=size * saved, minlength=n).astype(np.int64)
    held = np.bincount(group, weights=size * stats, minlength=n).astype(np.int64)
    stays = forward | saved | stats
    peaks = [_op_peaks(p, st, grp, stays, group, mem) for grp in common["groups"]]
    peak_node = np.repeat(np.arange(n), [len(x[0]) for x in peaks])
    peak_extra = np.concatenate([x[0] for x in peaks]) - mem[peak_node] - mem_saved[peak_node]
    peak_done = np.vstack([x[1] for x in peaks])
    prologue = sum(st.table.nbytes(x) for x in p.prologue)
    needs = np.zeros((n, n), dtype=bool)
    needs_saved = np.zeros((n, n), dtype=bool)
    for s, r in zip(stages, reads):
        got = np.fromiter(r, dtype=np.int64, count=len(r))
        needs[s, group[got[forward[got]]]] = True
        needs_saved[s, group[got[saved[got]]]] = True
    key = group + n * saved  # the columns of A: forward parts, then saved parts
    # backward values alone: the simulator on the backward ops in stage order (forward reads absent)
    steps = [(x.name, 0) for x in ordered]
    sim = simulate(p, Schedule(steps=steps, reads=[tuple((a.name, 0) for a in x.all_input_nodes) for x in ordered],
                               backward_start=0))
    before = sim.live - np.array([st.table.nbytes(x) for x in ordered], dtype=np.int64)
    between = np.zeros(n, dtype=np.int64)
    grads: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n
    alive: list[np.ndarray] = [np.zeros((0, 2 * n), dtype=np.int64)] * n
    nxt = int(sim.live[-1]) if len(ordered) else 0
    for s in range(n - 1, -1, -1):
        idx = np.flatnonzero(stages == s)
        between[s] = before[idx[0]] if len(idx) else nxt
        nxt = between[s]
        if len(idx):
            grads[s], alive[s] = _backward_events([reads[j] for j in idx], sim.live[idx], size, key, 2 * n)
        else:  # a stage without backward ops: one event, what it keeps
            grads[s], alive[s] = np.array([between[s]]), np.zeros((1, 2 * n), dtype=np.int64)
    statistics = np.concatenate([[0], np.cumsum(held)[:-1]])  # of the nodes before forward stage t
    stage_ops = tuple(tuple(ordered[j].name for j in np.flatnonzero(stages == s)) for s in range(n))
    bwd_alive = np.vstack(alive)
    return Problem(mem=mem, saved=mem_saved, peak_node=peak_node, peak_extra=peak_extra, peak_done=peak_done,
                   needs=needs, needs_saved=needs_saved,
                   base=np.concatenate([statistics, between]) + prologue,
                   bwd_stage=np.repeat(np.arange(n), [len(x) for x in grads]),
                   bwd_base=np.concatenate(grads) + bwd_alive.sum(1) + prologue,
                   bwd_alive=bwd_alive, fixed=fixed, stage_ops=stage_ops, **common)


def _op_peaks(p: "Program", st: Counted, grp: tuple[int, ...], stays: np.ndarray, group: np.ndarray,
              mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The peaks of computing a group, its fx ops in order: (the bytes of its own storages alive at
    each op, each freed after its last read inside the group unless it ``stays``; (·, n) the bytes
    of the forward part ``mem`` of each input that no op from this one on reads), one per distinct
    second row (the larger first)."""
    ops = [x for v in grp for x in p.members[v]]
    made = [st.made(x) for x in ops]
    mine = {e for m in made for e in m}
    last = {e: q for q, m in enumerate(made) for e in m}  # own storage → its last op in the group
    ends: dict[int, int] = {}  # input storage → its last read in the group
    for q, x in enumerate(ops):
        for e in st.reads(x):
            (last if e in mine else ends)[e] = q
    for e in mine:
        if stays[e]:
            last[e] = len(ops)
    read_at = np.zeros((len(ops), len(mem)), dtype=np.int64)  # [q, i]: bytes of input i last read at q
    for e, q in ends.items():
        read_at[q, group[e]] += st.size[e]
    still = np.cumsum(read_at[::-1], axis=0)[::-1]  # [q, i]: read at q or after
    inputs = np.zeros(len(mem), dtype=bool)
    inputs[[group[e] for e in ends]] = True
    done = np.where(inputs[None, :], mem[None, :] - still, 0)
    own = np.zeros(len(ops), dtype=np.int64)
    live = 0
    for q, m in enumerate(made):
        live += sum(st.size[e] for e in m)
        own[q] = live
        live -= sum(st.size[e] for e, end in last.items() if end == q)
    rows, inverse = np.unique(done, axis=0, return_inverse=True)
    top = np.full(len(rows), np.iinfo(np.int64).min)
    np.maximum.at(top, inverse.ravel(), own)
    return top, rows


def _backward_events(reads: list[set[int]], grads: np.ndarray, size: np.ndarray, key: np.ndarray,
                     width: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The events of one backward stage whose ops read ``reads`` (storages) at backward bytes
    ``grads``: one per distinct set of storages still to be read (the larger backward bytes where
    two ops share it), as (backward bytes, A: the bytes still to be read, summed by ``key`` into
    ``width`` columns)."""
    last = {x: j for j, r in enumerate(reads) for x in r}
    read = np.fromiter(last, dtype=np.int64, count=len(last))
    ends = np.fromiter(last.values(), dtype=np.int64, count=len(last))
    alive = np.zeros((len(grads), width), dtype=np.int64)
    np.add.at(alive, (ends, key[read]), size[read])  # a storage's bytes at its last read …
    alive = np.cumsum(alive[::-1], axis=0)[::-1]  # … and at every op before it
    rows, inverse = np.unique(alive, axis=0, return_inverse=True)
    top = np.full(len(rows), np.iinfo(np.int64).min)
    np.maximum.at(top, inverse.ravel(), grads)
    return top, rows


def stage_memory(pb: Problem, R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """(T, n + 1) bytes of the schedule (R, S) (S: (T, 2n), S then S') as the program prices them:
    column k < n stage t's k-th event, U + H (where it computes k, U + H + the largest X_q less the
    inputs k frees after their last read), every value freed right after its last use in the stage
    unless kept into the next or read by the stage's backward ops; column n the peak of its backward
    events (0 in forward stages)."""
    n, T = pb.n, 2 * pb.n
    kept, stays = _stays(pb, S)
    used = _last_use(pb, R)
    last = np.where(stays | (S[:, :n] & (used < 0)), n - 1, used)  # kept in and unused: no FREE applies
    first = np.where(S[:, :n], 0, np.where(R, np.arange(n)[None, :], n))
    t, i = np.nonzero(first <= last)
    delta = _saved_delta(pb, R, S)
    np.add.at(delta, (t, first[t, i]), pb.mem[i])
    np.add.at(delta, (t, last[t, i] + 1), -pb.mem[i])
    # each op peak of a computed node: X_q, less the inputs it frees (FREE: c is their last use)
    qn = pb.peak_node
    qq, ii = np.nonzero(pb.peak_done)
    gone = (~stays[:, ii] & (used[:, ii] == qn[qq][None, :])) * pb.peak_done[qq, ii][None, :]
    at_op = np.broadcast_to(pb.peak_extra, (T, len(qn))).copy()
    np.add.at(at_op.T, qq, -gone.T)
    extra = np.full((T, n), np.iinfo(np.int64).min)
    np.maximum.at(extra.T, qn, at_op.T)
    out = np.zeros((T, n + 1), dtype=np.int64)
    out[:, :n] = np.cumsum(delta, axis=1)[:, :n] + np.where(R, extra, 0) + pb.base[:, None]
    np.maximum.at(out[:, n], n + pb.bwd_stage, pb.backward_peaks(kept))
    return out


def _saved_delta(pb: Problem, R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """(T, n + 1) changes of the saved parts' bytes at each event: S'[t] from the start, M'_k from its
    computation, gone after it unless the stage's backward ops read it or it is kept into the next."""
    n, T = pb.n, 2 * pb.n
    kept_in = S[:, n:]
    kept_on = np.vstack([kept_in[1:], np.zeros((1, n), dtype=bool)])
    delta = np.zeros((T, n + 1), dtype=np.int64)
    delta[:, 0] = kept_in @ pb.saved
    delta[:, :n] += R * pb.saved[None, :]
    read_here = np.vstack([np.zeros((n, n), dtype=bool), pb.needs_saved])
    leaves = ~read_here * (R.astype(np.int64) + kept_in - kept_on)
    delta[:, 1:] -= leaves * pb.saved[None, :]
    return delta


def _stays(pb: Problem, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, 2n) what each stage keeps into the next (S and S', the outputs too), and (T, n) the forward
    parts kept or read by its backward ops."""
    n = pb.n
    kept = np.vstack([S[1:], np.zeros((1, 2 * n), dtype=bool)])
    kept[:, :n] |= pb.pinned[None, :]
    stays = kept[:, :n].copy()
    stays[n:] |= pb.needs
    return kept, stays


def _last_use(pb: Problem, R: np.ndarray) -> np.ndarray:
    """(T, n) the last event of each stage that computes the value or a reader of it; -1: none."""
    eu, ev = pb.edges()
    last = np.where(R, np.arange(pb.n)[None, :], -1)
    np.maximum.at(last.T, eu, np.where(R[:, ev], ev[None, :], -1).T)
    return last


def keep(pb: Problem, R: np.ndarray) -> np.ndarray:
    """The least (S, S') for R, (T, 2n): each part of a value kept exactly while a later stage reads it
    (a computation or the backward ops) before computing it again; the outputs from their stage on.
    The schedule that runs depends on R alone, and this is how the simulator keeps its values."""
    n, T = pb.n, 2 * pb.n
    eu, ev = pb.edges()
    readers = np.zeros((n, n))
    readers[ev, eu] = 1  # [v, u]: computing v reads u
    reads = np.hstack([(R @ readers) > 0, np.zeros((T, n), dtype=bool)])
    reads[n:, :n] |= pb.needs
    reads[n:, n:] |= pb.needs_saved
    computed = np.hstack([R, R])
    pinned = np.concatenate([pb.pinned, np.zeros(n, dtype=bool)])
    S = np.zeros((T, 2 * n), dtype=bool)
    nxt = np.zeros(2 * n, dtype=bool)
    before = np.tile(np.arange(n), 2)
    for t in range(T - 1, 0, -1):  # present at t: read at t from an older copy, or later before any recompute
        S[t] = (~computed[t] & (reads[t] | nxt)) | (pinned & (before < t))
        nxt = S[t]
    return S

