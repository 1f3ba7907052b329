"""``chen`` and ``chen_greedy``: the segmentation of Chen et al. (2016), §4, as canonical strategies.

Chen et al. split a network at nodes every input-to-output path passes through. In the vocabulary of
Kusumoto et al. (2019, §2–3) such a node v is one whose lower set L_v (v and everything that reaches
it) has boundary ∂(L_v) = {v}: caching v alone lets the rest of the graph be computed again. A choice
of split nodes v_1, …, v_{k-1} (in topological order) is the lower-set sequence
L_{v_1} ≺ … ≺ L_{v_{k-1}} ≺ V, whose canonical strategy is Chen's segment-wise recomputation.

A graph with no such node besides its sources (Kusumoto Fig. 2: a skip connection from the first
node to the last) cannot be segmented and gets k = 1, i.e. no saving.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from recompute.core.graph import Graph
from recompute.core.lowerset import boundary_bytes, split_candidates
from recompute.planners.registry import InfeasibleBudget, Plan, register

__all__ = ["chen", "chen_greedy"]


def _sequence(g: Graph, ends: Sequence[int]) -> list[frozenset[int]]:
    """L_{v_1} ≺ … ≺ V for split nodes in topological order.

    Running unions keep the sequence increasing even where two L_v are not nested (several sources).
    """
    a = g.ancestors_mask()
    seq: list[frozenset[int]] = []
    current: frozenset[int] = frozenset()
    for v in ends:
        grown = current | frozenset(map(int, np.flatnonzero(a[v])))
        if grown != current and grown != g.nodes:
            seq.append(grown)
            current = grown
    return seq + [g.nodes]


def _check_budget(p: Plan, budget: int | None) -> Plan:
    if budget is not None and p.peak > budget:
        raise InfeasibleBudget(p.method, budget, p.peak)
    return p


CUTS = ("articulation", "least_boundary")


@register("chen")
def chen(g: Graph, *, budget: int | None = None, cuts: str = "articulation") -> Plan:
    """Chen's √n rule (§4.3 of Chen et al.): ≈ √n segments of ≈ √n nodes each.

    For each j = 1 … k−1 with k = round(√#V), a lower set L_v with |L_v| near j·#V/k ends a segment:

    - ``cuts="articulation"``: the split candidate (∂(L_v) = {v}) whose |L_v| is closest to j·#V/k.
    - ``cuts="least_boundary"``: of the L_v with |L_v| within #V/2k of j·#V/k, the one whose boundary
      ∂(L_v) holds the fewest bytes. This is Chen's mirror plan (Alg. 2) with a segment's whole boundary
      kept, the way they segment an unrolled LSTM over time (§5.3): its (h, c) state crosses every cut,
      so the graph has no articulation node inside to end a segment at.

    ``budget`` is only checked: a plan whose peak exceeds it raises :class:`InfeasibleBudget` (Chen's
    method has no other plan to offer).
    """
    if cuts not in CUTS:
        raise ValueError(f"chen: cuts={cuts!r} is not one of {', '.join(map(repr, CUTS))}")
    k = max(1, round(math.sqrt(g.n)))
    a = g.ancestors_mask()
    sizes = a.sum(axis=1)
    if cuts == "articulation":
        cands = split_candidates(g)
        ends = {cands[int(np.argmin(np.abs(sizes[cands] - j * g.n / k)))] for j in range(1, k)} if cands else set()
    else:
        cands = [v for v in range(g.n) if g.preds[v]]
        kept = boundary_bytes(g, a)
        ends = set()
        for j in range(1, k):
            window = [v for v in cands if abs(sizes[v] - j * g.n / k) <= g.n / (2 * k)]
            if window:
                ends.add(min(window, key=lambda v: (int(kept[v]), abs(sizes[v] - j * g.n / k))))
    order = sorted(ends, key=lambda v: (int(sizes[v]), v))
    p = Plan.from_sequence(g, _sequence(g, order), method="chen", budget=budget, candidates=len(cands), splits=order,
                           cuts=cuts)
    return _check_budget(p, budget)


def _algorithm3(g: Graph, cands: set[int], b: float) -> tuple[int, int, list[int]]:
    """Algorithm 3 of Chen et al. (memory planning with budget b): returns x, y and the split nodes.

    Walk the topological order accumulating output sizes in ``temp``; at a candidate where temp > b,
    end the segment there. x sums the sizes of the kept split outputs, y is the largest segment.
    """
    temp = x = y = 0
    splits: list[int] = []
    for v in g.topo_order:
        temp += int(g.mem[v])
        if v in cands and temp > b:
            x += int(g.mem[v])
            y = max(y, temp)
            splits.append(v)
            temp = 0
    return x, y, splits


@register("chen_greedy")
def chen_greedy(g: Graph, *, budget: int | None = None, grid: int = 6) -> Plan:
    """Algorithm 3 of Chen et al. with the budget search of their appendix.

    Run Algorithm 3 with b = 0 to get x and y, then with b = √(x·y) and on a ``grid``-point grid over
    [b/√2, √2·b]; keep the plan with the smallest eq. (2) peak (ties: least overhead). ``budget``
    is only checked, as for :func:`chen`.
    """
    cands = set(split_candidates(g))
    x, y, _ = _algorithm3(g, cands, 0)
    b0 = math.sqrt(x * y)
    tried = [b0, *np.linspace(b0 / math.sqrt(2), b0 * math.sqrt(2), grid)]
    best: Plan | None = None
    for b in tried:
        splits = _algorithm3(g, cands, b)[2]
        p = Plan.from_sequence(g, _sequence(g, splits), method="chen_greedy", budget=budget, chen_b=float(b), splits=splits)
        if best is None or (p.peak, p.overhead) < (best.peak, best.overhead):
            best = p
    assert best is not None
    return _check_budget(replace(best, info={**best.info, "tried": [float(b) for b in tried]}), budget)
