"""``milp``: optimal rematerialization as a mixed-integer program (Checkmate, Jain et al., MLSys 2020).

Stages. The nodes of V are numbered 0 … n-1 in topological order (``graph.topo_order``, the traced
order on a traced graph). Stage t < n is forward stage t: it computes node t. Stage n + s is the
backward stage of node n-1-s (nodes are differentiated from last to first): it may recompute any
node, then runs the backward ops of its node. There are T = 2n stages.

Variables (Checkmate §4): R[t, v] = 1 when stage t computes v; S[t, v] = 1 when the forward part of v
is kept from stage t-1 into stage t and S'[t, v] = 1 when its saved part is (the two parts are
defined under Pricing); FREE[t, i, k] = 1 when the forward part of i dies right after stage t
computes k (k is i itself or a successor of i); and U[t, k], the bytes of V's values alive while
stage t computes its k-th node (k < n). Constraints:

* frontier: R[t, t] = 1 and R[t, v] = 0 for v > t in forward stages; S[t, v] = S'[t, v] = 0 for v ≥ t there;
* dependencies: R[t, v] ≤ R[t, u] + S[t, u] for every edge (u, v) (a forward op reads forward parts);
* keeping: S[t+1, v] ≤ R[t, v] + S[t, v], R[t, v] + S[t, v] ≤ 1 (one copy at a time), and the same for S';
* the backward ops of stage t read the forward parts of N_t and the saved parts of N'_t:
  R[t, i] + S[t, i] ≥ 1 for i ∈ N_t, R[t, i] + S'[t, i] ≥ 1 for i ∈ N'_t;
* a value neither read in a backward stage nor an ancestor of one read there or later is neither
  computed nor kept there (a bound that only removes useless schedules);
* freeing: FREE[t, i, k] ≤ R[t, k], ≤ 1 - S[t+1, i] and ≤ 1 - R[t, j] for every successor j > k of i.
  Checkmate also forces FREE to 1 when all three hold; freeing only lowers U, so we keep the upper
  bounds alone (a solution that leaves a dead value unfreed is still a correct, pessimistic one);
* memory: U[t, 0] = Σ_i (S[t, i] M_i + S'[t, i] M'_i) + R[t, 0] (M_0 + M'_0) and
  U[t, k] = U[t, k-1] - Σ_i FREE[t, i, k-1] M_i + R[t, k] (M_k + M'_k)
  - M'_{k-1} (R[t, k-1] + S'[t, k-1] - S'[t+1, k-1]) [the last term unless k-1 ∈ N'_t]: a saved part
  leaves right after its node unless the stage's backward ops read it or it is kept;
* peak of each op q of node c (one row per op that differs): U[t, c] + R[t, c] X_q
  - Σ_i FREE[t, i, c] D_{q,i} + H_t ≤ B, an input whose last use in the stage is c being gone once
  the ops of c have read it for the last time (where c is not computed: U[t, c] + H_t ≤ B);
* peak of each backward event e of stage t (a backward op): H'_e + Σ_i S[t+1, i] (M_i - A_{e,i})
  + Σ_i S'[t+1, i] (M'_i - A'_{e,i}) ≤ B (in the last stage the outputs take the place of S[T]).

Objective (Checkmate's: the cost of every computation): Σ_t Σ_v T_v R[t, v]; ``overhead`` is that
minus T(V), the work done twice (Kusumoto's eq. (1) for a canonical strategy).
Without a budget the program first minimises the peak (the overhead as a tie-break of weight
10⁻⁶ M(V) in all), then the overhead at that peak.

Pricing. The schedule that runs (:func:`_schedule`) is the prologue, then stage by stage the fx ops
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
  stages (:mod:`recompute.simulate` on the backward ops in stage order, tangents from the start,
  parameter gradients to the end); in both the prologue's values;
* a backward event e is a backward op: H'_e is the backward values' bytes at it (the same
  simulation), the prologue's values and A_e + A'_e, the parts of the stage's storages read at e or
  later; the ops of a stage that leave the same storages to be read are one event (the largest).

On a graph built from edges M_v and T_v are the graph's (M'_v = X = D = 0), the backward ops of v
(one event) read δ⁻(v) ∪ {v}, and the gradient of v (M_v bytes) lives from the backward stage of its
first differentiated successor (of the backward start for an output) to the end of v's.

Where the program and the simulator can still differ. A schedule is priced at the least (S, S')
that runs it (:func:`keep`; ``info["model_peak"]``); the program never under-prices it. It
over-prices where (1) a node's forward part dies whole after the last of its forward readers in
the stage (storages of a multi-output op or of a coarse node read by different successors), (2) a
kept part is held whole although only some of its storages are read later, (3) the prologue's
values are held all step and a recomputed copy of BatchNorm statistics to the end of its node.
Measured with :func:`on_demand` schedules (``tests/test_milp.py``; approxdp-TC's caches at three
budgets on the networks at the paper's batch): on the graph itself the excess is at most 64 bytes
(≤ 0.5%) on the test's small networks and under 0.05% on ResNet-50 and DenseNet-161; coarsened to
40 nodes, under 0.05% on ResNet-50, ≤ 0.1% on DenseNet-161, and up to 39% on random 10-node DAGs of
the tests coarsened to 4 nodes (random kept sets). The plan's ``peak`` is the simulator's exact peak of the
schedule that runs. Where the plan's simulated peak misses the budget the program's budget is moved
by the excess (or slack) and the program solved again, up to ``retries`` times (bisecting once a
budget that fits and one that does not are known); the plan is the least overhead that fits
(``info["milp_budget"]``).

Warm start. HiGHS starts from a heuristic schedule (``warm_start``: lower-set plans, by default
approxdp-TC's at the budget): :func:`on_demand` keeps the plan's cache U_k and its last block from the
forward pass (a coarse node kept when all its nodes are; where one mixes kept and recomputed nodes,
also the variant keeping it when any is), and each backward stage computes what its backward ops
read and is not there, keeping each value exactly while a later stage reads it (:func:`point` gives
the program's variables for it, checked against every row). On the stage grid this is not the plan's
canonical schedule (the grid differentiates in reverse topological order, the plan block by block),
so it is priced again: its overhead, program peak and simulated peak are its own
(``info["warm_start"]``). When it fits the budget it is a candidate and HiGHS starts from it (at a
program budget raised to its program peak where the program overprices it): the plan is then never
worse than the warm start and HiGHS always has a schedule. ``scipy.optimize.milp`` takes no initial
solution, so the model goes to scipy's vendored HiGHS bindings directly (:func:`_highs`; cold
through ``scipy.optimize.milp`` where they are missing).

Bound. ``info["bound"]`` is HiGHS's lower bound on the overhead of any schedule of the (coarse)
program whose program peak fits the program budget of the plan (``info["milp_budget"]``; a bound
found at a larger program budget holds there too). The program over-prices a schedule only by the
amounts above, so on the graph itself (no coarsening) and at a program budget equal to the budget it
bounds, up to those few bytes, every schedule of the stage grid whose simulated peak fits; on a
coarsened graph or at a raised program budget it bounds only the schedules the program admits.

Coarsening. A graph with more than ``max_nodes`` nodes is coarsened first: a node whose only
predecessor has it as only successor, and directly precedes it in the order, is merged into it,
cheapest pair (fewest bytes) first; when no chain is left, the cheapest two neighbours in the order
are merged; until ``max_nodes`` remain (``info["coarsened_from"]``, ``info["coarsened_to"]``). A merged
run is one variable: computed whole, its forward and saved parts kept and freed whole, so the
coarse optimum is an upper bound on the fine one.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp as highs_milp

from ..fxnodes import is_random
from ..graph import Graph
from ..memory_model import MemoryModel
from ..plan import InfeasibleBudget, Plan, register
from ..schedule import Schedule, Writer
from ..simulate import simulate
from ..storage import Counted, joint_table

if TYPE_CHECKING:
    import torch.fx as fx

    from ..trace import Program

__all__ = ["milp", "lp_bound", "Problem", "problem", "coarsen", "stage_memory", "point", "keep", "on_demand",
           "NoSolution"]

_TIE = 1e-6  # without a budget: the overhead's weight beside the peak (a fraction of M(V) in all)
_STATUS = {0: "optimal", 1: "time_limit", 2: "infeasible", 3: "unbounded", 4: "error"}


class NoSolution(RuntimeError):
    """HiGHS stopped (time limit) before it found any schedule within the budget."""


@dataclass(frozen=True)
class Problem:
    """One instance of the program, over (coarse) nodes 0 … n-1 in stage order.

    Attributes:
        groups: for each coarse node, its nodes of V (a run of consecutive nodes of the order).
        preds: δ⁻ of each coarse node (smaller indices).
        mem: M_c in bytes: what of c outlives its computation and a forward op of another node reads
            (or a step output): kept by S.
        saved: M'_c in bytes: what of c outlives its computation and only backward ops read: kept by S'.
        peak_node: (Q,) the node of each op peak (one or more per node: its ops that differ).
        peak_extra: (Q,) X_q: bytes at the op besides U[t, c] (its node's storages alive there, minus
            M_c + M'_c, which U counts).
        peak_done: (Q, n) D_{q,i}: the bytes of the forward part of c's input i that no op of c from
            this one on reads (gone where c is i's last use in the stage: FREE[t, i, c]).
        time: T_c in cost units.
        needs: (n, n) booleans; row s: the values whose forward part the backward ops of backward stage
            n + s read.
        needs_saved: (n, n) booleans; row s: the values whose saved part they read.
        base: (T,) bytes of stage t that no variable decides, at its events k < n (H_t).
        bwd_stage: (E,) the backward stage s of each backward event (a backward op of stage n + s).
        bwd_base: (E,) bytes alive at the event whatever is kept (H'_e).
        bwd_alive: (E, 2n) the part of M_c (columns < n) and of M'_c (columns ≥ n) counted in
            ``bwd_base`` (what the stage reads of c at the event or later, A_{e,c}): c kept into the
            next stage adds the rest.
        pinned: values that live to the end of the step (the step's outputs): kept once computed.
        fixed: nodes that draw random numbers: never recomputed in the forward phase.
        stage_ops: on a traced graph, the backward fx ops of each backward stage in run order.
    """

    groups: tuple[tuple[int, ...], ...]
    preds: tuple[tuple[int, ...], ...]
    mem: np.ndarray
    saved: np.ndarray
    peak_node: np.ndarray
    peak_extra: np.ndarray
    peak_done: np.ndarray
    time: np.ndarray
    needs: np.ndarray
    needs_saved: np.ndarray
    base: np.ndarray
    bwd_stage: np.ndarray
    bwd_base: np.ndarray
    bwd_alive: np.ndarray
    pinned: np.ndarray
    fixed: np.ndarray
    stage_ops: tuple[tuple[str, ...], ...] | None = None

    @property
    def n(self) -> int:
        return len(self.groups)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """E as arrays (u, v)."""
        pairs = [(u, v) for v, ps in enumerate(self.preds) for u in ps]
        arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def backward_peaks(self, kept: np.ndarray) -> np.ndarray:
        """(E,) bytes at each backward event, ``kept`` (T, 2n) being what each stage keeps into the next
        (S and S')."""
        whole = np.concatenate([self.mem, self.saved])
        return self.bwd_base + (kept[self.n + self.bwd_stage] * (whole[None, :] - self.bwd_alive)).sum(1)

    def floor(self) -> int:
        """Bytes every schedule has at some event: no budget below it fits."""
        return max(int(self.base.max(initial=0)), int(self.bwd_base.max(initial=0)))


# --- coarsening ------------------------------------------------------------------------------------


def coarsen(g: Graph, max_nodes: int | None) -> list[tuple[int, ...]]:
    """Runs of consecutive nodes of ``g.topo_order`` merged until at most ``max_nodes`` remain: chains
    first, then any two neighbours in the order (a run of a topological order is convex: the coarse
    graph stays a DAG)."""
    runs = [[v] for v in g.topo_order]
    if max_nodes is None or g.n <= max_nodes:
        return [tuple(r) for r in runs]
    mem = [int(g.mem[v]) for v in g.topo_order]

    def chained(a: list[int], b: list[int]) -> bool:
        """b's only predecessor outside b is a's last node, and that node's only successor is b's first."""
        outside_b = {u for v in b for u in g.preds[v]} - set(b)
        outside_a = {w for v in a for w in g.succs[v]} - set(a)
        return outside_b == {a[-1]} and outside_a == {b[0]} and set(g.preds[b[0]]) == {a[-1]}

    while len(runs) > max_nodes:
        pairs = [(mem[i] + mem[i + 1], i) for i in range(len(runs) - 1)]
        _, i = min([c for c in pairs if chained(runs[c[1]], runs[c[1] + 1])] or pairs)
        runs[i:i + 2] = [runs[i] + runs[i + 1]]
        mem[i:i + 2] = [mem[i] + mem[i + 1]]
    return [tuple(r) for r in runs]


# --- the instance ----------------------------------------------------------------------------------


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


# --- the program -----------------------------------------------------------------------------------


class _Rows:
    """Sparse constraint rows lo ≤ Σ coef · x[col] ≤ hi, added a block at a time."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.m = 0

    def add(self, lo: float | np.ndarray, hi: float | np.ndarray, *terms: tuple[np.ndarray, float | np.ndarray]) -> np.ndarray:
        """New rows, one per entry of the broadcast shape of the bounds and the terms' columns; returns
        their indices."""
        shape = np.broadcast_shapes(np.shape(lo), np.shape(hi), *(np.shape(c) for c, _ in terms))
        idx = self.m + np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        self.m += idx.size
        self.lo.append(np.broadcast_to(lo, shape).ravel().astype(float))
        self.hi.append(np.broadcast_to(hi, shape).ravel().astype(float))
        for col, coef in terms:
            self.term(idx, col, coef)
        return idx

    def term(self, rows: np.ndarray, col: np.ndarray, coef: float | np.ndarray) -> None:
        """Add coef · x[col] to existing rows (all three broadcast together)."""
        r, c, v = np.broadcast_arrays(rows, col, np.asarray(coef, dtype=float))
        self.rows.append(r.ravel())
        self.cols.append(c.ravel())
        self.vals.append(v.ravel())

    def constraint(self, nvars: int) -> LinearConstraint:
        a = sp.csr_matrix((np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
                          shape=(self.m, nvars))
        return LinearConstraint(a, np.concatenate(self.lo), np.concatenate(self.hi))


@dataclass
class _Program:
    """The assembled program and where its variables are."""

    c: np.ndarray
    constraint: LinearConstraint
    bounds: Bounds
    integrality: np.ndarray
    r: np.ndarray  # (T, n) indices of R
    s: np.ndarray  # (T, 2n) indices of S and S'
    f: np.ndarray  # (T, pairs) indices of FREE
    u: np.ndarray  # (T, n) indices of U
    pairs: tuple[np.ndarray, np.ndarray]  # the FREE pairs (i, k)
    scale: float

    @property
    def size(self) -> tuple[int, int]:
        return self.constraint.A.shape[1], self.constraint.A.shape[0]


def _assemble(pb: Problem, budget: int | None) -> _Program:
    """Checkmate's program for ``pb`` (see the module docstring); ``budget=None``: minimise the peak."""
    n, T = pb.n, 2 * pb.n
    eu, ev = pb.edges()
    pi = np.concatenate([np.arange(n), eu])  # FREE pairs (i, k): k = i or a successor of i
    pk = np.concatenate([np.arange(n), ev])
    npairs = len(pi)
    t = np.arange(T)[:, None]
    r = t * n + np.arange(n)
    s_all = T * n + t * 2 * n + np.arange(2 * n)
    s, sv = s_all[:, :n], s_all[:, n:]  # S (the forward part) and S' (the saved part)
    f = 3 * T * n + t * npairs + np.arange(npairs)
    u = 3 * T * n + T * npairs + t * n + np.arange(n)
    nvars = 3 * T * n + T * npairs + T * n + (budget is None)
    scale = float(max(int(pb.mem.sum() + pb.saved.sum()), 1))
    m, mv = pb.mem / scale, pb.saved / scale
    lo, hi = np.zeros(nvars), np.ones(nvars)
    fwd = np.arange(n)
    earlier = fwd[None, :] < fwd[:, None]  # [t, v]: v < t
    hi[r[:n][fwd[None, :] > fwd[:, None]]] = 0  # forward stage t computes nothing after t …
    lo[r[fwd, fwd]] = 1  # … and t itself
    hi[s[:n][~earlier]] = hi[sv[:n][~earlier]] = 0  # and keeps only what came before it
    hi[r[:n][earlier & pb.fixed[None, :]]] = 0  # random ops run once in the forward phase
    lo[s[:n][earlier & pb.pinned[None, :]]] = 1  # outputs live to the end
    lo[s[n:][:, pb.pinned]] = 1
    hi[sv[:, pb.saved == 0]] = 0
    hi[f[:n][(pk[None, :] > fwd[:, None])]] = 0
    hi[f[n:][pb.needs[:, pi]]] = 0  # a value the backward ops read is not freed before them
    hi[f[:, pb.pinned[pi]]] = 0
    # a value is of use in backward stage n + s only while it or a descendant is read at s or later
    below = np.eye(n, dtype=bool)
    for v in range(n):
        for w in pb.preds[v]:
            below[v] |= below[w]
    read = (pb.needs | pb.needs_saved).astype(np.int64)
    useful = np.logical_or.accumulate((read @ below > 0)[::-1], axis=0)[::-1]
    hi[r[n:][~useful]] = 0
    hi[s[n:][~useful & ~pb.pinned[None, :]]] = 0
    hi[sv[n:][~useful]] = 0
    rows = _Rows()
    rows.add(-np.inf, 0, (r[:, ev], 1), (r[:, eu], -1), (s[:, eu], -1))  # dependencies
    for keep_var, needs in ((s, pb.needs), (sv, pb.needs_saved)):
        need = np.argwhere(needs)
        rows.add(1, np.inf, (r[n + need[:, 0], need[:, 1]], 1), (keep_var[n + need[:, 0], need[:, 1]], 1))
        rows.add(-np.inf, 0, (keep_var[1:], 1), (r[:-1], -1), (keep_var[:-1], -1))  # keeping
        rows.add(-np.inf, 1, (r, 1), (keep_var, 1))
    rows.add(-np.inf, 0, (f, 1), (r[:, pk], -1))  # freeing
    rows.add(-np.inf, 1, (f[:-1], 1), (s[1:, pi], 1))
    succs = [np.flatnonzero(ev_row) for ev_row in (eu[None, :] == np.arange(n)[:, None])]
    pj = [(p, int(ev[e])) for p in range(npairs) for e in succs[pi[p]] if ev[e] > pk[p]]
    if pj:
        pp, jj = np.array(pj).T
        rows.add(-np.inf, 1, (f[:, pp], 1), (r[:, jj], 1))
    # memory: U[t, k] - U[t, k-1] - R[t, k] (M_k + M'_k) + Σ_{pairs freed after k-1} FREE M_i
    # (- S[t] · M - S'[t] · M' at k = 0); the saved part of k leaves after k unless the stage's
    # backward ops read it or it is kept: + M'_k (R[t, k] + S'[t, k] - S'[t+1, k]) at k + 1
    mem_rows = rows.add(0, 0, (u, 1))
    rows.term(mem_rows[:, 1:], u[:, :-1], -1)
    rows.term(mem_rows, r, -(m + mv))
    rows.term(mem_rows[:, [0]], s, -m)
    rows.term(mem_rows[:, [0]], sv, -mv)
    inside = pk + 1 < n  # a value freed after the last event leaves no U
    rows.term(mem_rows[:, pk[inside] + 1], f[:, inside], m[pi[inside]])
    read_here = np.vstack([np.zeros((n, n), dtype=bool), pb.needs_saved])
    tt, kk = np.nonzero(~read_here & (pb.saved > 0)[None, :] & (np.arange(n) + 1 < n)[None, :])
    rows.term(mem_rows[tt, kk + 1], r[tt, kk], mv[kk])
    rows.term(mem_rows[tt, kk + 1], sv[tt, kk], mv[kk])
    on = tt + 1 < T
    rows.term(mem_rows[tt[on], kk[on] + 1], sv[tt[on] + 1, kk[on]], -mv[kk[on]])
    # backward events: what the stage keeps into the next adds M_c − A_{e,c} (the last stage: the outputs)
    e_stage = n + pb.bwd_stage
    coef = np.hstack([pb.mem[None, :] - pb.bwd_alive[:, :n], pb.saved[None, :] - pb.bwd_alive[:, n:]]) / scale
    last = e_stage + 1 == T
    fixed_bytes = np.where(last, (coef[:, :n] * pb.pinned[None, :]).sum(1), 0.0) + pb.bwd_base / scale
    ee, cc = np.nonzero((coef > 0) & ~last[:, None])
    ok = hi[s_all[e_stage[ee] + 1, cc]] > 0
    ee, cc = ee[ok], cc[ok]
    # op peaks: U[t, c] + R[t, c] X_q - Σ_i FREE[t, i, c] D_{q,i} (an input whose last use is c is gone
    # once c has read it for the last time)
    qn = pb.peak_node
    qq, ii = np.nonzero(pb.peak_done)
    pair = {(int(a), int(b)): j for j, (a, b) in enumerate(zip(pi, pk))}
    fq = np.array([pair[(int(i), int(qn[q]))] for q, i in zip(qq, ii)], dtype=np.int64)
    hi[u] = np.inf
    if budget is None:
        peak_var = nvars - 1
        hi[peak_var] = np.inf
        peaks = rows.add(-np.inf, -pb.base[:, None] / scale, (u[:, qn], 1), (r[:, qn], pb.peak_extra[None, :] / scale),
                         (np.full((T, len(qn)), peak_var), -1))
        events = rows.add(-np.inf, -fixed_bytes, (np.full(len(e_stage), peak_var), -1))
        c = np.zeros(nvars)
        c[peak_var] = 1
        c[r] = _TIE * pb.time[None, :] / max(T * int(pb.time.sum()), 1)
    else:
        peaks = rows.add(-np.inf, (budget - pb.base[:, None]) / scale, (u[:, qn], 1),
                         (r[:, qn], pb.peak_extra[None, :] / scale))
        events = rows.add(-np.inf, budget / scale - fixed_bytes)
        c = np.zeros(nvars)
        c[r] = pb.time[None, :]
    rows.term(peaks[:, qq], f[:, fq], -pb.peak_done[qq, ii] / scale)
    rows.term(events[ee], s_all[e_stage[ee] + 1, cc], coef[ee, cc])
    lo[u] = 0
    integrality = np.zeros(nvars)
    integrality[: 3 * T * n + T * npairs] = 1
    return _Program(c, rows.constraint(nvars), Bounds(lo, hi), integrality, r, s_all, f, u, (pi, pk), scale)


# --- solving ---------------------------------------------------------------------------------------


@dataclass
class Solution:
    """What HiGHS returned, decoded.

    Attributes:
        status: ``optimal``, ``time_limit`` (with an incumbent), …
        R, S: (T, n) booleans (compute, keep).
        objective: the program's objective: Σ T_v R[t, v] (budget) or the peak in bytes (no budget).
        bound: HiGHS's best bound on it (the LP value for a relaxation).
        mip_gap: HiGHS's relative gap between the two.
        seconds: wall time of HiGHS.
        variables, rows: size of the program.
        least_peak: it minimised the peak (no budget): ``bound`` bounds the peak, not the overhead.
        warm: HiGHS started from a given schedule (a warm start).
    """

    status: str
    R: np.ndarray
    S: np.ndarray
    objective: float
    bound: float
    mip_gap: float
    seconds: float
    variables: int
    rows: int
    least_peak: bool
    warm: bool = False


def _highs(prog: _Program, integrality: np.ndarray, options: dict[str, Any],
           start: np.ndarray | None) -> tuple[int, np.ndarray | None, float, float, float, str]:
    """Solve with HiGHS: (status code of ``_STATUS``, x or None, objective, best bound, mip gap, message).

    ``scipy.optimize.milp`` takes no initial solution, so where scipy vendors its HiGHS bindings
    (``scipy.optimize._highspy._core``, a private module: scipy 1.17) the model is passed to them
    directly and ``start`` given to ``setSolution``; without them, ``scipy.optimize.milp`` solves it
    cold."""
    try:
        from scipy.optimize._highspy import _core as h
    except ImportError:
        res = highs_milp(prog.c, integrality=integrality, bounds=prog.bounds, constraints=prog.constraint,
                         options={**options, "disp": False})
        return (res.status, res.x, float(res.fun) if res.x is not None else np.nan,
                float(getattr(res, "mip_dual_bound", None) or res.fun or np.nan), float(getattr(res, "mip_gap", 0.0) or 0.0),
                res.message)
    a = sp.csc_matrix(prog.constraint.A)
    lp = h.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.format_ = h.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    inf = lambda x: np.clip(x, -h.kHighsInf, h.kHighsInf)  # noqa: E731
    lp.col_cost_ = prog.c
    lp.col_lower_, lp.col_upper_ = inf(prog.bounds.lb), inf(prog.bounds.ub)
    lp.row_lower_, lp.row_upper_ = inf(prog.constraint.lb), inf(prog.constraint.ub)
    if integrality.any():
        lp.integrality_ = [h.HighsVarType(int(i)) for i in integrality]
    highs = h._Highs()
    opts = h.HighsOptions()
    opts.output_flag = False
    opts.threads = 1
    for key, value in options.items():
        setattr(opts, key, value)
    highs.passOptions(opts)
    highs.passModel(lp)
    if start is not None:
        sol = h.HighsSolution()
        sol.col_value = start
        sol.value_valid = True
        highs.setSolution(sol)
    highs.run()
    status, info = highs.getModelStatus(), highs.getInfo()
    code = {h.HighsModelStatus.kOptimal: 0, h.HighsModelStatus.kTimeLimit: 1, h.HighsModelStatus.kInfeasible: 2,
            h.HighsModelStatus.kUnbounded: 3}.get(status, 4)
    message = highs.modelStatusToString(status)
    found = code == 0 or (code == 1 and info.primal_solution_status == h.kSolutionStatusFeasible)
    if not found:
        return code, None, np.nan, np.nan, np.nan, message
    x = np.array(highs.getSolution().col_value)
    mip = bool(integrality.any())
    fun = info.objective_function_value
    return code, x, fun, info.mip_dual_bound if mip else fun, info.mip_gap if mip else 0.0, message


def _solve(pb: Problem, budget: int | None, time_limit: float, mip_rel_gap: float, relax: bool = False,
           start: tuple[np.ndarray, np.ndarray] | None = None) -> Solution:
    """Assemble and solve, from the schedule ``start`` = (R, S) where it is a point of the program;
    :class:`InfeasibleBudget` when HiGHS proves no schedule fits the budget, :class:`NoSolution`
    when it stops before finding one."""
    if budget is not None and budget < pb.floor():
        raise InfeasibleBudget("milp", budget, None)
    prog = _assemble(pb, budget)
    x0 = point(pb, prog, *start) if start is not None else None
    began = _time.perf_counter()
    code, x, fun, bound, gap, message = _highs(
        prog, np.zeros_like(prog.integrality) if relax else prog.integrality,
        {"time_limit": float(time_limit), "mip_rel_gap": mip_rel_gap}, x0)
    seconds = _time.perf_counter() - began
    if code == 2:
        raise InfeasibleBudget("milp", budget, None)
    if x is None:
        raise NoSolution(f"milp: HiGHS stopped ({message}) after {seconds:.1f}s without a schedule; "
                         "raise time_limit or lower max_nodes (coarser graph)")
    unit = prog.scale if budget is None else 1.0
    return Solution(
        status=_STATUS.get(code, "error"), R=x[prog.r] > 0.5, S=x[prog.s] > 0.5, objective=float(fun) * unit,
        bound=float(bound) * unit, mip_gap=float(gap), seconds=seconds, variables=prog.size[0], rows=prog.size[1],
        least_peak=budget is None, warm=x0 is not None,
    )


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


def point(pb: Problem, prog: _Program, R: np.ndarray, S: np.ndarray) -> np.ndarray | None:
    """The program's variables for the schedule (R, S): FREE taken right after each value's last use
    in a stage (as :func:`stage_memory`), U from its recursion, the peak variable (no budget) at the
    schedule's peak; ``None`` where that point breaks a bound or a constraint of ``prog``."""
    n = pb.n
    pi, pk = prog.pairs
    kept, stays = _stays(pb, S)
    last = _last_use(pb, R)
    free = (~stays & (last >= 0))[:, pi] & (last[:, pi] == pk[None, :])
    delta = _saved_delta(pb, R, S)
    delta[:, :n] += R * pb.mem[None, :]
    delta[:, 0] += S[:, :n] @ pb.mem
    np.add.at(delta.T, pk + 1, -(free * pb.mem[pi]).T)
    x = np.zeros(prog.c.size)
    x[prog.r], x[prog.s], x[prog.f], x[prog.u] = R, S, free, np.cumsum(delta, axis=1)[:, :n] / prog.scale
    if prog.c.size > prog.u.max() + 1:  # no budget: the peak variable
        x[-1] = stage_memory(pb, R, S).max() / prog.scale
    ax = prog.constraint.A @ x
    tol = 1e-9
    ok = ((x >= prog.bounds.lb - tol) & (x <= prog.bounds.ub + tol)).all()
    return x if ok and ((ax >= prog.constraint.lb - tol) & (ax <= prog.constraint.ub + tol)).all() else None


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


def on_demand(pb: Problem, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, S) of the schedule that keeps ``kept`` (coarse nodes) from the forward pass and, in each
    backward stage, computes what its backward ops read and is not there (and the missing inputs of
    that), keeping every value exactly while a later stage reads it (:func:`keep`). With ``kept`` a
    canonical strategy's cache (∪ ∂(L_i) and the last block), it recomputes no more than the strategy
    does."""
    n, T = pb.n, 2 * pb.n
    R = np.zeros((T, n), dtype=bool)
    R[np.arange(n), np.arange(n)] = True
    there = kept | pb.pinned
    for t in range(n, T):
        want = (pb.needs[t - n] | pb.needs_saved[t - n]) & ~there
        for v in range(n - 1, -1, -1):  # inputs have smaller indices: one sweep closes the set
            if want[v]:
                ps = list(pb.preds[v])
                want[ps] |= ~there[ps]
        R[t] = want
        there = there | want
    return R, keep(pb, R)


def _kept(pb: Problem, plan: Plan) -> tuple[list[np.ndarray], int]:
    """Coarse kept sets for a lower-set ``plan``: its cache U_k and last block (what its canonical
    schedule keeps from the forward pass), a coarse node kept when all its nodes are and, where some
    coarse node mixes kept and dropped nodes, also when any is; and the number of such nodes."""
    nodes = plan.cached | plan.blocks[-1]
    share = np.array([sum(v in nodes for v in grp) / len(grp) for grp in pb.groups])
    mixed = int(((share > 0) & (share < 1)).sum())
    return ([share == 1, share > 0] if mixed else [share == 1]), mixed


def _schedule(g: Graph, pb: Problem, R: np.ndarray) -> Schedule:
    """The executable schedule of R: stage by stage, the nodes it computes (in order; a node computed
    again is a new copy), then in a backward stage its backward ops."""
    p = g.program
    out = Writer()
    for node in p.prologue:
        out.emit(node, 0, False)
    backward_start = 0
    for t in range(2 * pb.n):
        if t == pb.n:
            backward_start = len(out.steps)
        for c in np.flatnonzero(R[t]):
            for v in pb.groups[c]:
                for node in p.members[v]:
                    out.emit(node, t + 1, True)
        if t >= pb.n:
            for name in pb.stage_ops[t - pb.n]:
                out.emit(p.joint.node(name), t + 1, False)
    return out.schedule(backward_start)


@register("milp", simulates=True)
def milp(g: Graph, *, budget: int | None = None, strategy: str | None = None, time_limit: float = 60.0,
         max_nodes: int = 60, mip_rel_gap: float = 1e-4, retries: int = 4,
         warm_start: Sequence[Plan] | None = None) -> Plan:  # fmt: skip
    """The least recomputation (Σ T_v R[t, v]) whose peak fits ``budget``, over every schedule of the stages
    (see the module docstring); ``budget=None``: the smallest peak, then the least overhead at it.

    ``time_limit`` bounds each HiGHS solve (seconds); the plan keeps HiGHS's status, its bound and
    gap in ``info``. Graphs of more than ``max_nodes`` nodes are coarsened. On a traced graph the
    plan carries its :class:`~recompute.schedule.Schedule` and ``peak`` is its simulated peak;
    ``retries`` bounds the re-solves with the program's budget moved by the simulated excess or slack.
    ``warm_start``: lower-set plans HiGHS starts from (their cache kept, :func:`on_demand`), by
    default approxdp-TC's at ``budget``; ``()`` for a cold start.
    """
    if strategy is not None:
        raise ValueError("milp: takes no strategy (it minimises the overhead within the budget)")
    pb = problem(g, max_nodes)
    total = g.total_time()
    info: dict[str, Any] = {"coarsened_from": g.n, "coarsened_to": pb.n, "time_limit": time_limit}
    known, info["warm_start"] = _warm(g, pb, budget, total, warm_start)
    fitting = [c for c in known if budget is not None and c.peak <= budget]  # no budget: the least peak first
    best = min(fitting, key=lambda c: c.overhead, default=None)
    info["warm_overhead"] = best.overhead if best is not None else None
    solves: list[Solution] = []
    bounds: list[tuple[int, float]] = []  # (program budget, HiGHS's bound on Σ T R there)

    def start(limit: int | None) -> tuple[np.ndarray, np.ndarray] | None:
        """The least-overhead schedule known whose program peak fits ``limit`` (None: the least peak)."""
        ok = [c for c in known if limit is None or c.model_peak <= limit]
        pick = min(ok, key=(lambda c: c.model_peak) if limit is None else (lambda c: c.overhead), default=None)
        return (pick.solution.R, pick.solution.S) if pick is not None else None

    model_budget = budget
    fits = overshoots = None  # program budgets whose plan fits / exceeds the budget, when simulated
    if budget is None:  # the least peak, then (if HiGHS finds one in time) the least overhead at it
        solves.append(_solve(pb, None, time_limit, mip_rel_gap, start=start(None)))
        info["peak_bound"] = int(solves[0].bound)
        model_budget = int(stage_memory(pb, solves[0].R, keep(pb, solves[0].R)).max())
        known.append(_Candidate.price(g, pb, solves[0], model_budget, total))  # the start at that peak
    elif best is not None and best.model_peak > budget:  # the program overprices the warm start: let it in
        model_budget = best.model_peak
    for attempt in range(retries + 1):
        try:
            sol = _solve(pb, model_budget, time_limit, mip_rel_gap, start=start(model_budget))
            bounds.append((model_budget, sol.bound))
        except (NoSolution, InfeasibleBudget):
            if best is not None:
                break
            if budget is None and solves:
                sol = solves[0]
            elif g.program is not None and attempt == 0:  # the model overprices: try its least peak
                sol = _solve(pb, None, time_limit, mip_rel_gap, start=start(None))
                model_budget = int(stage_memory(pb, sol.R, keep(pb, sol.R)).max())
            else:
                raise
        if not any(x is sol for x in solves):
            solves.append(sol)
        got = _Candidate.price(g, pb, sol, model_budget, total)
        known.append(got)
        if budget is None or got.peak <= budget:
            best = got if best is None or got.overhead <= best.overhead else best  # ties: the solve, with its status
        if budget is None or g.program is None or got.overhead == 0 or got.peak == budget:
            break
        # the model is not the simulator: move the program's budget by the slack or the excess
        if got.peak <= budget:
            fits = model_budget
        else:
            overshoots = model_budget
        if fits is not None and overshoots is not None:
            if overshoots - fits <= max(1, budget // 1000):
                break
            model_budget = (fits + overshoots) // 2
        elif fits is None:
            model_budget = min(model_budget - (got.peak - budget), int(model_budget * 0.99))
        else:
            model_budget += budget - got.peak
    if best is None:
        raise InfeasibleBudget("milp", budget, None)
    sol = best.solution
    # the optimum falls as the program's budget rises: a bound at a larger budget holds at the plan's
    valid = [b for mb, b in bounds if mb is not None and mb >= best.model_budget]
    bound = 0.0 if sol.least_peak or not valid else max(0.0, max(valid) - total)
    info.update(
        status=sol.status, objective=best.overhead, bound=bound,
        gap=(best.overhead - bound) / best.overhead if best.overhead else 0.0, mip_gap=sol.mip_gap,
        highs_seconds=sum(x.seconds for x in solves), solves=len(solves), model_peak=best.model_peak,
        milp_budget=best.model_budget, variables=solves[-1].variables if solves else 0,
        rows=solves[-1].rows if solves else 0, R=sol.R, S=sol.S, model=MemoryModel.milp,
    )
    cached = frozenset(v for c in np.flatnonzero(sol.S[pb.n, :pb.n] | sol.S[pb.n, pb.n:]) for v in pb.groups[c])
    model = MemoryModel.milp if g.program is None else MemoryModel.simulator
    return Plan(method="milp", strategy=None, lower_sets=[g.nodes], cached=cached, overhead=best.overhead,
                peak=best.peak, budget=budget, info=info, memory_model=model,
                schedule=best.schedule)


def _warm(g: Graph, pb: Problem, budget: int | None, total: int,
          plans: Sequence[Plan] | None) -> tuple[list["_Candidate"], str]:  # fmt: skip
    """The warm starts of ``plans`` (default: approxdp-TC's at ``budget``) on the stage grid, priced,
    and what became of them (said in ``info["warm_start"]``)."""
    if plans is None:
        from ..plan import plan as make_plan

        try:
            plans = [make_plan(g, "approxdp", strategy="tc", budget=budget)]
        except InfeasibleBudget:
            return [], "none: approxdp-TC has no plan at this budget"
    out: list[_Candidate] = []
    notes: list[str] = []
    for p in plans:
        if p.schedule is not None:
            notes.append(f"{p.method}: no lower-set plan, not used")
            continue
        masks, mixed = _kept(pb, p)
        for kept in masks:
            R, S = on_demand(pb, kept)
            warm = Solution(status="warm_start", R=R, S=S, objective=float((pb.time * R).sum()), bound=np.nan,
                            mip_gap=np.nan, seconds=0.0, variables=0, rows=0, least_peak=budget is None, warm=True)
            c = _Candidate.price(g, pb, warm, None, total)
            c.model_budget = c.model_peak
            out.append(c)
        label = f"{p.method}-{p.strategy.upper() if p.strategy else ''}"
        notes.append(f"{label} (overhead {p.overhead}, peak {p.peak}) → {len(masks)} schedule(s)"
                     + (f", {mixed} coarse nodes mix kept and recomputed values" if mixed else "")
                     + ": " + ", ".join(f"overhead {c.overhead}, peak {c.peak}" for c in out[-len(masks):]))
    return out, "; ".join(notes) or "none"


@dataclass
class _Candidate:
    """A solution priced: its overhead, its model peak, and on a traced graph its schedule's simulated peak."""

    solution: Solution
    model_budget: int | None
    overhead: int
    model_peak: int
    peak: int
    schedule: Schedule | None

    @classmethod
    def price(cls, g: Graph, pb: Problem, sol: Solution, model_budget: int | None, total: int) -> "_Candidate":
        """Its schedule priced by the program at the least S that runs it (:func:`keep`) and simulated."""
        sol = replace(sol, S=keep(pb, sol.R))
        model_peak = int(stage_memory(pb, sol.R, sol.S).max())
        sched = _schedule(g, pb, sol.R) if g.program is not None else None
        peak = simulate(g.program, sched).peak if sched is not None else model_peak
        return cls(sol, model_budget, int((pb.time[None, :] * sol.R).sum()) - total, model_peak, peak, sched)


def lp_bound(g: Graph, budget: int, *, max_nodes: int | None = None, time_limit: float = 60.0) -> float:
    """The LP relaxation's optimum: a lower bound on the overhead of every schedule of the program
    for ``g`` (coarsened to ``max_nodes``; ``None``: the graph itself) whose model peak fits ``budget``."""
    sol = _solve(problem(g, max_nodes), budget, time_limit, 0.0, relax=True)
    return max(0.0, sol.objective - g.total_time())
