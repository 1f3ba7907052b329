"""Memory models: what a plan's ``peak`` and ``budget`` are expressed in, and how a lower-set sequence
is priced under each.

* ``simulator`` — the exact peak of the schedule that runs (:mod:`recompute.pricing.simulate`; for the DPs
  block by block, :mod:`recompute.pricing.blockcost`): what :mod:`recompute.doors.measure` reports. The default on a
  traced graph.
* ``paper`` — eq. (2) of Kusumoto et al. (2019, §3), the default on a graph built from edges.
* ``liveness`` — eq. (2) with the bytes plain autograd really keeps (``Graph.saved``).
* ``milp`` — the MILP's own program (:mod:`recompute.planners.milp`) on a graph built from edges;
  no planner is asked to plan with it.

The two formulas share eq. (2)'s shape, M({L_1 ≺ … ≺ L_k}) = max_i M(U_{i-1}) + B(L_{i-1}, L_i): the
cache of the blocks below plus a term of the block alone (:meth:`MemoryModel.block`), which is what
the DPs and the exhaustive search add up.
"""

from __future__ import annotations

from enum import StrEnum
from typing import AbstractSet, Any, Sequence

import numpy as np

from recompute.core import lowerset
from recompute.core.graph import Graph
from recompute.pricing.schedule import canonical
from recompute.pricing.simulate import simulate

__all__ = ["MemoryModel", "PLANNING", "gradient_allowance"]

NodeSet = AbstractSet[int]


class MemoryModel(StrEnum):
    """A memory model (see the module docstring); a ``str``, so ``"paper"`` names ``MemoryModel.paper``."""

    simulator = "simulator"
    paper = "paper"
    liveness = "liveness"
    milp = "milp"

    @classmethod
    def parse(cls, value: Any, *, choices: Sequence["MemoryModel"] | None = None,
              what: str = "memory_model") -> "MemoryModel":  # fmt: skip
        """``value`` as a member of ``choices`` (default: all); ValueError naming ``what`` and the choices."""
        allowed = list(choices if choices is not None else cls)
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
        return cls(value)

    @classmethod
    def default(cls, g: Graph) -> "MemoryModel":
        """The simulator on a traced graph (its peak is the measured one), eq. (2) otherwise."""
        return cls.simulator if g.program is not None else cls.paper

    @property
    def formula(self) -> bool:
        """Whether the model is a closed formula on the graph's sizes (eq. 2 or its liveness variant)."""
        return self in (MemoryModel.paper, MemoryModel.liveness)

    def _formula(self) -> None:
        if not self.formula:
            raise ValueError(f"memory model {self.value!r} is no formula on the graph's sizes; "
                             f"use {MemoryModel.paper.value!r} or {MemoryModel.liveness.value!r}")

    def block(self, g: Graph, lower: NodeSet, upper: NodeSet) -> tuple[int, int]:
        """(B(L, L′), M(∂(L′) \\ L)) for the block V′ = L′ \\ L: its term besides the cache M(U) below,
        and the bytes it adds to the cache.

        ``paper`` (eq. 2): B = 2 M(V′) + M(δ⁺(L′) \\ L′) + M(δ⁻(δ⁺(L′)) \\ L′): every value of the block
        and its gradient alive at once, every op keeping all its inputs. ``liveness``: B = M(∂(L′) \\ L)
        + S(V′ \\ ∂(L′)) + M(δ⁺(L′) \\ L′) + S(δ⁻(δ⁺(L′)) \\ L′) + 2 max_v M_v: the block's new cache
        kept whole, the saved values (S_v ≤ M_v) of its recomputed rest, the gradients arriving from
        above, the saved inputs of the nodes above, and two gradients in flight."""
        self._formula()
        src, dst = g.edge_arrays
        below, inside = lowerset.node_mask(g, lower), lowerset.node_mask(g, upper)
        block = inside & ~below
        leaving = inside[src] & ~inside[dst]  # the edges from L′ to the nodes above it
        above, bd, inputs_above = (np.zeros(g.n, dtype=bool) for _ in range(3))
        above[dst[leaving]] = True
        bd[src[leaving]] = True
        inputs_above[src[above[dst] & ~inside[src]]] = True
        added = _sum(g.mem, bd & ~below)
        if self is MemoryModel.paper:
            return 2 * _sum(g.mem, block) + _sum(g.mem, above) + _sum(g.mem, inputs_above), added
        return (added + _sum(g.saved, block & ~bd) + _sum(g.mem, above) + _sum(g.saved, inputs_above)
                + gradient_allowance(g)), added

    def block_memory(self, g: Graph, seq: Sequence[NodeSet]) -> list[int]:
        """M(U_{i-1}) + B(L_{i-1}, L_i) for every block i of a formula model."""
        out: list[int] = []
        cache, lower = 0, frozenset()
        for upper in seq:
            term, added = self.block(g, lower, upper)
            out.append(cache + term)
            cache, lower = cache + added, frozenset(upper)
        return out

    def peak(self, g: Graph, seq: Sequence[NodeSet]) -> int:
        """The peak of the canonical strategy of ``seq``: the simulator's (a traced graph), or
        M({L_1 ≺ … ≺ L_k}) = max_i M(i) of a formula."""
        if self is MemoryModel.simulator:
            if g.program is None:
                raise ValueError("memory model 'simulator' needs a traced graph (recompute.trace)")
            return simulate(g.program, canonical(g, seq)).peak
        return max(self.block_memory(g, seq))

    def dp_terms(self, g: Graph) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """The DPs' per-node terms of a formula (:mod:`recompute.planners.dp`): W (a set's weight),
        X (inside a block), the constant extra, and hold (what a cached node keeps beyond X)."""
        self._formula()
        if self is MemoryModel.paper:
            return 2 * g.mem, g.mem, 0, np.zeros_like(g.mem)
        return g.saved, g.saved, gradient_allowance(g), g.mem - g.saved


PLANNING = (MemoryModel.simulator, MemoryModel.paper, MemoryModel.liveness)  # what a planner may be asked to plan with


def gradient_allowance(g: Graph) -> int:
    """The liveness model's working set of gradients: 2 max_v M_v (the gradient arriving at a node and
    the one it produces)."""
    return 2 * int(g.mem.max()) if g.n else 0


def _sum(values: np.ndarray, nodes: np.ndarray) -> int:
    """Σ values[v] over the nodes of a boolean mask."""
    return int(values[nodes].sum())
