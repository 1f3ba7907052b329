"""The MILP's instance: the stage grid and the (coarse) nodes it is posed over.

Stages. The nodes of V are numbered 0 … n-1 in topological order (``graph.topo_order``, the traced
order on a traced graph). Stage t < n is forward stage t: it computes node t. Stage n + s is the
backward stage of node n-1-s (nodes are differentiated from last to first): it may recompute any
node, then runs the backward ops of its node. There are T = 2n stages.

Coarsening. A graph with more than ``max_nodes`` nodes is coarsened first: a node whose only
predecessor has it as only successor, and directly precedes it in the order, is merged into it,
cheapest pair (fewest bytes) first; when no chain is left, the cheapest two neighbours in the order
are merged; until ``max_nodes`` remain (``info["coarsened_from"]``, ``info["coarsened_to"]``). A merged
run is one variable: computed whole, its forward and saved parts kept and freed whole, so the
coarse optimum is an upper bound on the fine one.

"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recompute.core.graph import Graph

__all__ = ["Problem", "coarsen"]


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

