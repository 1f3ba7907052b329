"""``reforward_linear`` and ``reforward``: Re-forwarding (Feng & Huang 2018) as canonical strategies.

The *optimization graph* of the paper (§3) has the tensors as vertexes and the operations as edges;
our :class:`~recompute.core.graph.Graph` has one node per tensor-producing operation, i.e. one vertex per
output tensor, so V carries over and l(v) = M_v. :class:`OptimizationGraph` adds the two vertexes
the paper's solvers start and end at: the source s (the network input) and the target t (the loss,
fed by every output), both of cost 0 because neither is an activation of V.

A re-forwarding solution stores V_R during the first forward and re-forwards every other vertex in
a *segment* from the stored vertex the segment starts at; its memory is eq. (1),

    Σ_{v ∈ V_R} l(v) + max_segment l(segment),

kept as ``plan.info["feng_memory"]`` (bytes). ``reforward_linear`` is Algorithm 1 on the linear
structure given by the splitting vertexes of the whole graph (Def. 3; Chen-style segments kept
whole); ``reforward`` is Algorithm 6 on the multi-hierarchy built by Algorithms 2–5.

**Why a solution is a canonical strategy.** Every segment is a close set s_pq (Def. 1): its vertexes
read only each other and v_p, and only v_q and each other read them. Give every stored vertex v its
own block V_v = {v} ∪ (the segments ending at v), and order the blocks by v in topological order; the
segments ending at t, and stored vertexes nothing in V reads, form the last block. Each prefix union
L is a lower set (a segment's only outside predecessor is its stored start, in an earlier block), its
boundary ∂(L) is the stored vertexes of L that something later reads, and V_v \\ ∂(L) is exactly the
segments ending at v. So the canonical strategy caches V_R and recomputes each segment once, from
stored vertexes, in its block's backward: Feng's solution, except that segments sharing their end
vertex are re-forwarded together, because the backward of v_q needs all of v_q's inputs at once.
No solution needs a schedule beyond a lower-set sequence: each segment is recomputed once.

**Where this reads the paper's text.** Algorithm 4 forms only the close set of *all* the vertexes
between two vertexes, so a close set that is one branch among others between its ends comes out as
crossing pieces; they are merged by Theorem 1 (:func:`_merge_overlaps`). Algorithm 6's max-term list
(line 1) holds the costs of the close sets the multi-hierarchy can re-forward as one segment: any
other value has the solution of the next listed value below it (Algorithm 1, line 7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from recompute.core import lowerset
from recompute.core.graph import Graph
from recompute.planners.registry import Plan, register
from recompute.planners.chen import _check_budget

__all__ = [
    "OptimizationGraph", "CloseSet", "Hierarchy", "LinearSolution", "Solution", "linear_solver",
    "splitting_vertices", "branches", "maximal_split", "reorganise", "solve_hierarchy",
    "arbitrary_solver", "executed_memory", "reforward_linear", "reforward",
]


# ---------------------------------------------------------------------------------------------------
# The optimization graph with its source and target


@dataclass(eq=False)
class OptimizationGraph:
    """G = (E, V) of §3 over vertexes ``0..n-1`` of a :class:`Graph`, plus s = n and t = n + 1.

    Attributes:
        cost: l(v) in bytes (M_v; 0 for s and t).
        adj: adj[u, v] iff (u, v) ∈ E.
        anc: anc[v, u] iff u ≠ v has a path to v (so ``anc.T`` is "has a path from").
        rank: position of each vertex in a topological order.
    """

    cost: np.ndarray
    adj: np.ndarray
    anc: np.ndarray
    rank: np.ndarray

    @classmethod
    def of(cls, g: Graph) -> "OptimizationGraph":
        """s feeds every node without predecessors, t reads every output and every sink."""
        s, t = g.n, g.n + 1
        adj = np.zeros((g.n + 2, g.n + 2), dtype=bool)
        for v, ps in enumerate(g.preds):
            adj[list(ps) if ps else [s], v] = True
        ends = set(g.outputs) | {v for v in range(g.n) if not g.succs[v]}
        adj[sorted(ends), t] = True
        order = [s, *g.topo_order, t]
        anc = np.zeros_like(adj)
        for v in order:
            for u in np.flatnonzero(adj[:, v]):
                anc[v] |= anc[u]
                anc[v, u] = True
        rank = np.empty(g.n + 2, dtype=np.int64)
        rank[order] = np.arange(g.n + 2)
        return cls(cost=np.append(g.mem, [0, 0]).astype(np.int64), adj=adj, anc=anc, rank=rank)

    @property
    def source(self) -> int:
        return len(self.cost) - 2

    @property
    def target(self) -> int:
        return len(self.cost) - 1

    def between(self, i: int, j: int, within: np.ndarray) -> np.ndarray:
        """The vertexes of ``within`` (in topological order) with paths from v_i and to v_j."""
        return within[self.anc[within, i] & self.anc[j, within]]


# ---------------------------------------------------------------------------------------------------
# Close sets and the single-hierarchy re-organiser (§4.1, Algorithms 2–5)


@dataclass(frozen=True, eq=False)
class CloseSet:
    """s_ij of Definition 1: the vertexes ``interior`` strictly between v_i and v_j, and whether the
    edge (v_i, v_j) belongs to it (the two valid close sets Definition 1 allows)."""

    i: int
    j: int
    interior: np.ndarray
    edge: bool = False

    def closed(self) -> np.ndarray:
        """[s_ij] (Definition 2) with v_i first and v_j last."""
        return np.concatenate([[self.i], self.interior, [self.j]]).astype(np.int64)


def splitting_vertices(og: OptimizationGraph, cs: CloseSet) -> np.ndarray:
    """Algorithm 2 for every v_t ∈ s_ij at once, in topological order.

    v_t splits s_ij iff {v_in} ∪ {v_out} ∪ {v_t} = [s_ij] and no edge of s_ij joins v_in to v_out,
    where v_in (v_out) are the vertexes of [s_ij] with paths to (from) v_t.
    """
    if cs.edge or cs.interior.size == 0:  # the edge (v_i, v_j) joins v_in ∋ v_i to v_out ∋ v_j
        return cs.interior[:0]
    w = cs.closed()
    sub = og.adj[np.ix_(w, w)]
    sub[0, -1] = False  # an edge (v_i, v_j) outside s_ij (the other close set of Definition 1)
    eu, ev = np.nonzero(sub)
    v_in = og.anc[np.ix_(cs.interior, w)]
    v_out = og.anc[np.ix_(w, cs.interior)].T
    covers = v_in.sum(1) + v_out.sum(1) + 1 == len(w)
    joined = (v_in[:, eu] & v_out[:, ev]).any(1)
    return cs.interior[covers & ~joined]  # the interior is in topological order already


def branches(og: OptimizationGraph, cs: CloseSet) -> list[CloseSet]:
    """Algorithm 3, grown for every start vertex at once: the connected parts of the interior, plus
    the edge (v_i, v_j) as a branch of its own when s_ij includes it. s_ij is branched (Definition 4)
    iff there are two or more; the branches are its maximal split (Definition 7)."""
    parts: list[CloseSet] = [CloseSet(cs.i, cs.j, cs.interior[:0], edge=True)] if cs.edge else []
    inner = og.adj[np.ix_(cs.interior, cs.interior)]
    link = inner | inner.T | np.eye(len(cs.interior), dtype=bool)
    label = np.arange(len(cs.interior))
    while True:  # every vertex takes the smallest label among its neighbours until nothing changes
        grown = np.where(link, label[None, :], len(label)).min(1)
        grown = grown[grown]
        if np.array_equal(grown, label):
            break
        label = grown
    for root in np.unique(label):
        parts.append(CloseSet(cs.i, cs.j, cs.interior[label == root]))
    return parts


def maximal_split(og: OptimizationGraph, cs: CloseSet) -> list[CloseSet]:
    """Algorithm 4: the maximal split (Definition 6) of a non-branched s_ij with 0 splitting vertex.

    Lines 1–4 for every pair (v_k, v_t) of [s_ij] at once: I(k, t), the vertexes with paths from v_k
    and to v_t, form a close set iff none of them has a predecessor outside I(k, t) ∪ {v_k} or a
    successor outside I(k, t) ∪ {v_t}; counted with two matrix products. Every edge is a (trivial)
    close set too, so that the members cover [s_ij] (Fig. 4 (b)). Lines 5–6: a close set is a member
    iff no other close set s_ab ⊊ s_ij contains both its ends, which for a close set s_ab means
    containing all of it.
    """
    w = cs.closed()
    size = len(w)
    edges = og.adj[np.ix_(w, w)]
    edges[0, -1] = False  # (v_i, v_j) is not part of a non-branched s_ij
    below = og.anc[np.ix_(w, w)].T  # below[k, x]: x has a path from v_k
    above = og.anc[np.ix_(w, w)]  # above[t, x]: x has a path to v_t
    eye = np.eye(size, dtype=bool)
    f32 = np.float32  # counts of at most #V, exact in float32
    preds_ok = ((below | eye).astype(f32) @ edges.astype(f32)) == edges.sum(0)  # [k, x]: δ⁻(x) ⊆ {v_k} ∪ below v_k
    succs_ok = ((above | eye).astype(f32) @ edges.T.astype(f32)) == edges.sum(1)  # [t, x]: δ⁺(x) ⊆ {v_t} ∪ above v_t
    inside = below.astype(f32) @ above.T.astype(f32)  # |I(k, t)|
    clean = (below & preds_ok).astype(f32) @ (above & succs_ok).T.astype(f32)
    closed = (inside == clean) & (inside > 0)
    candidate = closed | edges
    candidate[0, -1] = False
    ks, ts = np.nonzero(candidate)
    inner = closed[ks, ts]
    member = below[ks] & above[ts]  # I(k, t) per candidate (empty for a bare edge)
    member[~inner] = False
    span = member.copy()
    span[np.arange(len(ks)), ks] = True
    span[np.arange(len(ks)), ts] = True
    contains = span[:, ks] & span[:, ts] & inner[:, None]  # [c, c']: s_c' ⊊ s_c
    np.fill_diagonal(contains, False)
    keep = np.flatnonzero(~contains.any(0))
    split = [CloseSet(int(w[ks[c]]), int(w[ts[c]]), w[member[c]], edge=bool(edges[ks[c], ts[c]])) for c in keep]
    return _merge_overlaps(og, split)


def _merge_overlaps(og: OptimizationGraph, split: list[CloseSet]) -> list[CloseSet]:
    """Theorem 1 applied to Algorithm 4's members: two close sets that overlap without nesting meet in
    s_kj (possibly a bare edge: then each holds an end of the other inside), and their union, from the
    outer start to the outer end, is a close set holding both.

    Algorithm 4 forms only the close set of *all* the vertexes between two vertexes, so a close set
    that is one branch among others between its ends (a chain v_k → … → v_t beside other paths from
    v_k to v_t) is found as overlapping pieces; merging them restores the disjoint members that
    Definition 6 and Theorem 4 require. Members the union contains are dropped, a bare edge between
    its ends included (the union then holds that edge).
    """
    members = list(split)
    while True:
        inner = [m for m in members if m.interior.size]  # a bare edge can only lie inside a member
        own = np.zeros((len(inner), len(og.cost)), dtype=np.float32)
        for r, m in enumerate(inner):
            own[r, m.interior] = 1.0
        span = own.copy()
        for r, m in enumerate(inner):
            span[r, [m.i, m.j]] = 1.0
        hits = own @ span.T  # [a, b]: a vertex inside s_a belongs to [s_b]
        hits += hits.T
        np.fill_diagonal(hits, 0)
        if not hits.any():
            return members
        x, y = np.argwhere(hits > 0)[0]
        a, b = inner[x], inner[y]
        start = a.i if a.i not in b.interior else b.i
        end = a.j if a.j not in b.interior else b.j
        interior = np.union1d(a.interior, b.interior)
        interior = interior[np.argsort(og.rank[interior])]
        whole = {start, end, *interior.tolist()}
        merged = CloseSet(start, end, interior, edge=bool(og.adj[start, end]))

        def inside(m: CloseSet) -> bool:
            return m.i in whole and m.j in whole and ((m.i, m.j) != (start, end) or set(m.interior.tolist()) <= whole)

        members = [m for m in members if not inside(m)] + [merged]


@dataclass(eq=False)
class Hierarchy:
    """One level of the multi-hierarchy of Algorithm 5 over the close set ``cs``.

    ``kind`` is ``"trivial"`` (no vertex), ``"linear"`` (``vertices`` are the splitting vertexes in
    order and ``members`` the segments between consecutive ones, Theorem 3) or ``"split"`` (a maximal
    split: the branches of a branched close set, or Algorithm 4's members; ``vertices`` are the
    members' ends inside s_ij). ``cost`` is the sum of l over the interior (Alg. 5, line 9);
    ``max_terms`` are the re-forward costs this level and those below can produce, sorted.
    """

    cs: CloseSet
    kind: str
    cost: int
    vertices: np.ndarray
    members: list["Hierarchy"]
    max_terms: np.ndarray = field(repr=False)
    _memo: dict[int, "Solution"] = field(default_factory=dict, repr=False)

    def count(self) -> dict[str, int]:
        """How many close sets of each kind the hierarchy holds."""
        out = {"trivial": 0, "linear": 0, "split": 0, self.kind: 1}
        for m in self.members:
            for kind, k in m.count().items():
                out[kind] += k
        return out

    def depth(self) -> int:
        return 1 + max((m.depth() for m in self.members), default=0)


def _prefix(vertex_cost: np.ndarray, segment_cost: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vertex costs of a linear structure x_0 … x_r (the ends set to 0: whoever holds them stores
    them) and prefix sums G, F with l(x_p, x_q) = F[q] − G[p], the re-forward cost between stored x_p
    and x_q: the vertexes strictly between them and the segments from x_p to x_q."""
    lv = vertex_cost.astype(np.int64)
    lv[[0, -1]] = 0
    seg = np.concatenate([segment_cost, [0]])
    cum_v, cum_s = np.cumsum(lv), np.cumsum(seg)
    g_ = cum_v + cum_s - seg  # Σ_{u ≤ p} l(x_u) + Σ_{u < p} c_u
    f_ = cum_v - lv + cum_s - seg  # Σ_{u < q} l(x_u) + Σ_{u < q} c_u
    return lv, g_, f_


def _pair_costs(g_: np.ndarray, f_: np.ndarray) -> np.ndarray:
    """l(x_p, x_q) for every p < q: every max term of a linear structure (Alg. 1, lines 1–2)."""
    r = len(g_)
    p, q = np.triu_indices(r, 1)
    return f_[q] - g_[p]


def reorganise(og: OptimizationGraph, cs: CloseSet) -> Hierarchy:
    """Algorithm 5 applied recursively (Algorithm 6, line 2): the multi-hierarchy of s_ij.

    A close set with splitting vertexes becomes a linear level whose segments hide in the next
    hierarchy; one without becomes its maximal split (branches, or Algorithm 4), whose members hide in
    the next hierarchy; one without vertexes is trivial.
    """
    cost = int(og.cost[cs.interior].sum())
    if cs.interior.size == 0:
        return Hierarchy(cs, "trivial", 0, cs.interior, [], np.zeros(1, np.int64))
    split = splitting_vertices(og, cs)
    if split.size:
        ends = np.concatenate([[cs.i], split, [cs.j]])
        members = [
            reorganise(og, CloseSet(int(a), int(b), og.between(a, b, cs.interior), edge=bool(og.adj[a, b])))
            for a, b in zip(ends[:-1], ends[1:])
        ]
        seg_cost = np.array([m.cost for m in members], dtype=np.int64)
        _, g_, f_ = _prefix(og.cost[ends], seg_cost)
        own = _pair_costs(g_, f_)
        kind, vertices = "linear", split
    else:
        parts = branches(og, cs)
        if len(parts) == 1:
            parts = maximal_split(og, cs)
        members = [reorganise(og, p) for p in parts]
        vertices = np.setdiff1d(np.array([v for p in parts for v in (p.i, p.j)], np.int64), [cs.i, cs.j])
        vertices = vertices[np.argsort(og.rank[vertices])]
        own = np.array([m.cost for m in members], dtype=np.int64)
        kind = "split"
    max_terms = np.unique(np.concatenate([own, *(m.max_terms for m in members)]))
    return Hierarchy(cs, kind, cost, vertices, members, max_terms)


# ---------------------------------------------------------------------------------------------------
# Solvers: Algorithm 1 (linear) and Algorithm 6 (arbitrary)


Segment = tuple[int, int, np.ndarray]  # (start vertex, end vertex, the vertexes it re-forwards)


@dataclass(eq=False)
class Solution:
    """A re-forwarding solution of one hierarchy under one max term: the stored vertexes strictly
    inside it, its segments, Σ l over the stored vertexes and the largest segment cost."""

    stored_cost: int
    max_reforward: int
    stored: list[int]
    segments: list[Segment]
    parts: list["Solution"]

    @property
    def memory(self) -> int:
        """Eq. (1): stored tensors + the largest re-forward."""
        return self.stored_cost + self.max_reforward

    def flatten(self) -> tuple[list[int], list[Segment]]:
        stored, segments = list(self.stored), list(self.segments)
        for part in self.parts:
            s, seg = part.flatten()
            stored += s
            segments += seg
        return stored, segments


def _shortest_path(lv: np.ndarray, g_: np.ndarray, f_: np.ndarray, a: int, b: int, m: int) -> list[int]:
    """Algorithm 1, lines 3–4, on x_a … x_b: the shortest path from x_a to x_b in the accessibility
    graph (edge x_p → x_q iff l(x_p, x_q) ≤ m), weighted by the l of the vertexes it stores. G is
    non-decreasing, so the x_p with an edge to x_q form a range ending at q − 1 and each step is a
    range minimum. Needs every segment of x_a … x_b to cost at most m (then x_{q-1} → x_q exists)."""
    dist = np.zeros(b - a + 1, dtype=np.int64)
    parent = np.zeros(b - a + 1, dtype=np.int64)
    for q in range(1, b - a + 1):
        lo = int(np.searchsorted(g_[a:a + q], f_[a + q] - m, side="left"))
        p = lo + int(np.argmin(dist[lo:q]))
        dist[q] = dist[p] + lv[a + q]
        parent[q] = p
    path = [b - a]
    while path[-1] != 0:
        path.append(int(parent[path[-1]]))
    return [a + p for p in reversed(path)]


def _search(max_terms: np.ndarray, solve: Callable[[int], Solution]) -> tuple[Solution, int]:
    """Algorithm 1, lines 1–2 and 5–7 (Algorithm 6, lines 3 and 10): try the max terms from the
    largest down; a solution whose actual max term B is below the tried C is also the solution of
    every max term in [B, C), so those are skipped. Returns the best solution and the number of max
    terms solved."""
    best = solve(int(max_terms[-1]))
    tried, idx = 1, int(np.searchsorted(max_terms, best.max_reforward, side="left")) - 1
    while idx >= 0:
        sol = solve(int(max_terms[idx]))
        tried += 1
        if sol.memory < best.memory:
            best = sol
        idx = int(np.searchsorted(max_terms, sol.max_reforward, side="left")) - 1
    return best, tried


def _linear_run(ends: np.ndarray, segs: list[np.ndarray], lv: np.ndarray, g_: np.ndarray, f_: np.ndarray,
                a: int, b: int, m: int) -> Solution:
    """The stored vertexes and segments of x_a … x_b under max term m (x_a and x_b are stored by the
    caller: their cost is not counted here)."""
    path = _shortest_path(lv, g_, f_, a, b, m)
    stored, segments, biggest = [int(ends[p]) for p in path[1:-1]], [], 0
    for p, q in zip(path[:-1], path[1:]):
        biggest = max(biggest, int(f_[q] - g_[p]))
        inner = np.concatenate([ends[p + 1:q], *segs[p:q]]).astype(np.int64)
        if inner.size:
            segments.append((int(ends[p]), int(ends[q]), inner))
    return Solution(int(lv[path[1:-1]].sum()), biggest, stored, segments, [])


def _solve_linear(ends: np.ndarray, vertex_cost: np.ndarray, seg_cost: np.ndarray,
                  segs: list[np.ndarray]) -> tuple[Solution, int]:
    """Algorithm 1 over x_0 … x_r (stored ends) whose segments are re-forwarded whole: a max term
    below the largest segment leaves no path, so the search starts above it."""
    lv, g_, f_ = _prefix(vertex_cost, seg_cost)
    terms = np.unique(_pair_costs(g_, f_))
    terms = terms[terms >= (seg_cost.max() if seg_cost.size else 0)]
    return _search(terms, lambda m: _linear_run(ends, segs, lv, g_, f_, 0, len(ends) - 1, m))


@dataclass(frozen=True)
class LinearSolution:
    """Algorithm 1's answer on a linear graph x_0 … x_r: the stored positions (ends included), eq. (1),
    its largest re-forward and the number of max terms solved."""

    stored: list[int]
    memory: int
    max_reforward: int
    max_terms_tried: int


def linear_solver(vertex_cost: np.ndarray, segment_cost: np.ndarray | None = None) -> LinearSolution:
    """Algorithm 1 on a linear optimization graph x_0 → … → x_r (r ≥ 1) with l(x_u) = ``vertex_cost[u]``
    and, between x_u and x_{u+1}, a segment re-forwarded whole of cost ``segment_cost[u]`` (default 0:
    a plain edge). x_0 and x_r are the source and the target, always stored; eq. (1) counts them."""
    vc = np.asarray(vertex_cost, dtype=np.int64)
    if len(vc) < 2:
        raise ValueError("a linear optimization graph needs a source and a target")
    sc = np.zeros(len(vc) - 1, np.int64) if segment_cost is None else np.asarray(segment_cost, dtype=np.int64)
    sol, tried = _solve_linear(np.arange(len(vc)), vc, sc, [np.zeros(0, np.int64)] * len(sc))
    return LinearSolution(sorted({0, len(vc) - 1, *sol.stored}), sol.memory + int(vc[0] + vc[-1]),
                          sol.max_reforward, tried)


def solve_hierarchy(og: OptimizationGraph, h: Hierarchy, m: int) -> Solution:
    """Algorithm 6, lines 4–9, for one max term m.

    Linear level: the segments costing more than m are expanded (solved in the next hierarchy); they
    cut the level into linear runs, each solved by Algorithm 1's shortest path under m. Split level:
    its vertexes are stored, members costing more than m are expanded, the others re-forwarded whole.
    The answer depends on m only through the largest max term of ``h`` not above it, which keys a memo.
    """
    key = int(np.searchsorted(h.max_terms, m, side="right"))
    if key in h._memo:
        return h._memo[key]
    expand = [k.cost > m for k in h.members]
    parts = [solve_hierarchy(og, k, m) for k, e in zip(h.members, expand) if e]
    stored_cost = sum(p.stored_cost for p in parts)
    biggest = max((p.max_reforward for p in parts), default=0)
    if h.kind == "linear":
        ends = np.concatenate([[h.cs.i], h.vertices, [h.cs.j]])
        seg_cost = np.array([k.cost for k in h.members], dtype=np.int64)
        lv, g_, f_ = _prefix(og.cost[ends], seg_cost)
        cuts = sorted({0, len(ends) - 1, *(u for u, e in enumerate(expand) if e), *(u + 1 for u, e in enumerate(expand) if e)})
        stored = [int(ends[u]) for u in cuts[1:-1]]
        stored_cost += int(lv[cuts[1:-1]].sum())
        segments: list[Segment] = []
        segs = [k.cs.interior for k in h.members]
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b == a + 1 and expand[a]:
                continue
            run = _linear_run(ends, segs, lv, g_, f_, a, b, m)
            stored += run.stored
            segments += run.segments
            stored_cost += run.stored_cost
            biggest = max(biggest, run.max_reforward)
    else:
        stored = [int(v) for v in h.vertices]
        stored_cost += int(og.cost[h.vertices].sum())
        segments = [(k.cs.i, k.cs.j, k.cs.interior) for k, e in zip(h.members, expand) if not e and k.cs.interior.size]
        biggest = max([biggest, *(k.cost for k, e in zip(h.members, expand) if not e)])
    sol = Solution(stored_cost, biggest, stored, segments, parts)
    h._memo[key] = sol
    return sol


def arbitrary_solver(og: OptimizationGraph, h: Hierarchy) -> tuple[Solution, int]:
    """Algorithm 6: every max term of the multi-hierarchy (line 1, restricted to the close sets a
    segment can be: any other value gives the solution of the next one below, line 7 of Alg. 1),
    from the largest down with Algorithm 1's skip rule."""
    return _search(h.max_terms, lambda m: solve_hierarchy(og, h, m))


# ---------------------------------------------------------------------------------------------------
# Plans


def _lower_sets(g: Graph, og: OptimizationGraph, stored: list[int], segments: list[Segment]) -> list[frozenset[int]]:
    """The lower-set sequence of a re-forwarding solution (see the module docstring)."""
    last = {og.target} | {v for v in stored if not g.succs[v]}
    block: dict[int, set[int]] = {v: {v} for v in stored if v not in last}
    tail: set[int] = {v for v in stored if v in last}
    for _, end, inner in segments:
        (tail if end in last else block[end]).update(int(v) for v in inner)
    seq: list[frozenset[int]] = []
    current: frozenset[int] = frozenset()
    for v in sorted(block, key=lambda v: og.rank[v]):
        current = current | block[v]
        seq.append(current)
    if not seq or seq[-1] != g.nodes:
        seq.append(g.nodes)
    assert current | tail == g.nodes and len(stored) + sum(len(s[2]) for s in segments) == g.n, \
        "every vertex is stored or re-forwarded, by one segment"
    return seq


def executed_memory(g: Graph, seq: list[frozenset[int]]) -> int:
    """Eq. (1) of a lower-set sequence as the canonical strategy runs it: l(U_k) plus the largest
    l(V_i \\ U_k), i.e. the largest block recomputed (the last block counted whole: it is alive when
    backward starts). It differs from ``feng_memory`` where segments sharing an end vertex are
    re-forwarded together (more) and where stored outputs join the last block (counted in its max
    term instead of the sum)."""
    cached = lowerset.cached_set(g, seq)
    return int(g.mem[sorted(cached)].sum()) + max(int(g.mem[sorted(b - cached)].sum()) for b in lowerset.blocks(seq))


def _plan(g: Graph, og: OptimizationGraph, sol: Solution, method: str, budget: int | None, **info: object) -> Plan:
    """The plan of a solution; ``info`` gets eq. (1) of the solution (``feng_memory``, bytes) and of
    the plan as it runs (``feng_memory_blocks``), Σ_v M_v (``feng_vanilla``) and the stored vertexes."""
    stored, segments = sol.flatten()
    seq = _lower_sets(g, og, stored, segments)
    p = Plan.from_sequence(
        g, seq, method=method, budget=budget,
        feng_memory=sol.memory, feng_stored=sol.stored_cost, feng_max_reforward=sol.max_reforward,
        feng_memory_blocks=executed_memory(g, seq), feng_vanilla=g.total_mem(), stored=sorted(stored),
        segments=len(segments), **info,
    )
    return _check_budget(p, budget)


@register("reforward_linear")
def reforward_linear(g: Graph, *, budget: int | None = None) -> Plan:
    """Algorithm 1 on the linear structure of G: its splitting vertexes (Algorithm 2 on s_st) with the
    close sets between them as segments re-forwarded whole, as the paper linearises non-linear
    networks for Chen et al. On a chain every vertex is a splitting vertex: Algorithm 1 proper.
    ``budget`` is only checked (Re-forwarding has none)."""
    og = OptimizationGraph.of(g)
    top = CloseSet(og.source, og.target, np.asarray(g.topo_order, dtype=np.int64))
    split = splitting_vertices(og, top)
    ends = np.concatenate([[og.source], split, [og.target]])
    segs = [og.between(a, b, top.interior) for a, b in zip(ends[:-1], ends[1:])]
    seg_cost = np.array([og.cost[s].sum() for s in segs], dtype=np.int64)
    sol, tried = _solve_linear(ends, og.cost[ends], seg_cost, segs)
    return _plan(g, og, sol, "reforward_linear", budget, splitting_vertices=len(split), max_terms_tried=tried)


@register("reforward")
def reforward(g: Graph, *, budget: int | None = None) -> Plan:
    """Algorithm 6 on G: the multi-hierarchy of s_st (Algorithms 2–5), then every max term with the
    greedy expansion of sub-hierarchies. ``budget`` is only checked (Re-forwarding has none)."""
    og = OptimizationGraph.of(g)
    h = reorganise(og, CloseSet(og.source, og.target, np.asarray(g.topo_order, dtype=np.int64)))
    sol, tried = arbitrary_solver(og, h)
    return _plan(g, og, sol, "reforward", budget, max_terms=len(h.max_terms), max_terms_tried=tried,
                 hierarchy_depth=h.depth(), close_sets=h.count())
