"""``exhaustive``: the depth-first search of Kusumoto et al. (2019), §4.1 — the oracle for small graphs.

The search walks every strictly increasing lower-set sequence ∅ ≺ L_1 ≺ … ≺ L_k = V whose prefixes
stay within the budget by eq. (2). As §4.1 observes, a prefix only matters through its state: the
last lower set L = L_i, its overhead t (eq. 1, the last block V_k not charged) and m = M(U_i); we also
carry its eq. (2) peak p so that one search answers every budget. States are visited once, nothing
dominated is pruned, and every quantity comes from :mod:`recompute.core.lowerset` on plain sets: it
shares no code with the DP and is exponential in #V (meant for #V ≤ ~12).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from recompute.core import lowerset
from recompute.core.families import pack_rows
from recompute.pricing.blockcost import BlockCosts
from recompute.core.graph import Graph
from recompute.pricing.memory_model import PLANNING, MemoryModel
from recompute.pricing.schedule import rng_order_preds
from recompute.planners.registry import InfeasibleBudget, Plan, register

__all__ = ["exhaustive", "lower_sets", "GraphTooLarge", "MAX_NODES"]

MAX_NODES = 16  # the lower sets and search states of a larger graph outgrow memory (VGG19: ~15 MB/s)


class GraphTooLarge(ValueError):
    """The graph has more nodes than ``max_nodes``; the message names the limit and the alternatives."""


def lower_sets(g: Graph) -> list[frozenset[int]]:
    """Every lower set of G, by size: grow each L by one node whose predecessors are all in L."""
    level: set[frozenset[int]] = {frozenset()}
    out: list[frozenset[int]] = []
    while level:
        out.extend(sorted(level, key=sorted))
        level = {
            lower | {v}
            for lower in level
            for v in range(g.n)
            if v not in lower and all(u in lower for u in g.preds[v])
        }
    return out


@register("exhaustive", searches_budget=True, simulator_default=True)
def exhaustive(g: Graph, *, budget: int | None = None, strategy: str | None = None,
               memory_model: str | None = None, max_nodes: int = MAX_NODES) -> Plan:  # fmt: skip
    """Least (``tc``) or most (``mc``) overhead over all canonical strategies within ``budget``.

    ``budget=None`` uses the smallest budget B* for which a canonical strategy exists. The peak is the
    simulator's (the default on a traced graph: blocks priced by :mod:`recompute.pricing.blockcost`, lower sets
    that keep random ops in the traced order), eq. (2) or its liveness variant
    (:meth:`recompute.pricing.memory_model.MemoryModel.block`). Graphs of more than ``max_nodes``
    nodes raise :class:`GraphTooLarge` before any search.
    """
    if g.n > max_nodes:
        raise GraphTooLarge(
            f"exhaustive: the graph has #V={g.n} nodes, above max_nodes={max_nodes} (the search is exponential "
            f"in #V); use exactdp or approxdp, which solve the same problem at this size, or pass a larger max_nodes"
        )
    strategy = strategy or "tc"
    if strategy not in ("tc", "mc"):
        raise ValueError(f"exhaustive: unknown strategy {strategy!r}; use 'tc' or 'mc'")
    memory_model = MemoryModel.parse(memory_model, choices=PLANNING) if memory_model else MemoryModel.default(g)
    everything = g.nodes
    simulator = memory_model == MemoryModel.simulator
    lowers = lower_sets(Graph(rng_order_preds(g), g.mem, g.time, g.names, g.ops, g.outputs) if simulator else g)
    if simulator:
        blocks = BlockCosts.of(g)
        if blocks is None:
            raise ValueError("exhaustive: this graph's backward reads forward values the block decomposition does "
                             f"not cover; use memory_model={MemoryModel.liveness.value!r}")
        row = {s: r for r, s in enumerate(lowers)}  # ∅ first, V last
        member = np.zeros((len(lowers), g.n), bool)
        bd = np.zeros_like(member)
        for r, s in enumerate(lowers):
            member[r, list(s)] = True
            bd[r, list(lowerset.boundary(g, s))] = True
        family = blocks.family(pack_rows(member), pack_rows(bd))
    # vanilla's peak (2 M(V) for eq. 2) admits every sequence
    if budget is not None:
        limit = int(budget)
    else:
        limit = family.cost(0, len(lowers) - 1) if simulator else memory_model.peak(g, [everything])

    @lru_cache(maxsize=None)
    def step(lower: frozenset[int], upper: frozenset[int]) -> tuple[int, int, int]:
        """Block V′ = L′ \\ L: (its memory without M(U), new cached memory, overhead)."""
        bd = lowerset.boundary(g, upper)
        t = 0 if upper == everything else sum(int(g.time[v]) for v in upper - lower - bd)
        if simulator:
            return family.cost(row[lower], row[upper]), int(blocks.cache[sorted(bd - lower)].sum()), t
        return (*memory_model.block(g, lower, upper), t)

    # Iterative DFS over states (L, t, m, p); ``parent`` keeps the first way each state was reached.
    start = (frozenset(), 0, 0, 0)
    parent: dict[tuple, tuple | None] = {start: None}
    stack = [start]
    finals: list[tuple] = []
    while stack:
        state = stack.pop()
        lower, t, m, p = state
        if lower == everything:
            finals.append(state)
            continue
        for upper in lowers:
            if not lower < upper:
                continue
            term, dm, dt = step(lower, upper)
            if m + term > limit:
                continue
            nxt = (upper, t + dt, m + dm, max(p, m + term))
            if nxt not in parent:
                parent[nxt] = state
                stack.append(nxt)

    if not finals:
        raise InfeasibleBudget("exhaustive", limit, exhaustive(g, strategy=strategy, memory_model=memory_model,
                                                                 max_nodes=max_nodes).budget)
    min_budget = min(p for *_, p in finals)  # every sequence within B* ≤ limit is among them
    if budget is None:
        budget = min_budget
        finals = [s for s in finals if s[3] <= budget]
    # tc: least overhead; mc: most. Ties go to the smaller peak, then to the first found.
    pick = min if strategy == "tc" else max
    best_t = pick(s[1] for s in finals)
    state: tuple | None = min((s for s in finals if s[1] == best_t), key=lambda s: s[3])
    seq = []
    while state is not None and state[0]:
        seq.append(state[0])
        state = parent[state]
    return Plan.from_sequence(
        g, seq[::-1], method="exhaustive", strategy=strategy, budget=budget, memory_model=memory_model,
        min_budget=min_budget, states=len(parent),
    )
