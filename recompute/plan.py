"""The ``Plan`` record and the planner registry: ``recompute.plan(graph, method=...)``."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import lowerset
from .graph import Graph
from .validate import check_budget, check_graph, check_method

__all__ = ["Plan", "InfeasibleBudget", "register", "plan", "methods", "STRATEGIES"]

STRATEGIES = ("tc", "mc")


class InfeasibleBudget(ValueError):
    """No canonical strategy fits the budget; ``min_budget`` is the smallest budget that has one."""

    def __init__(self, method: str, budget: int, min_budget: int | None):
        self.method, self.budget, self.min_budget = method, budget, min_budget
        hint = f"the smallest feasible budget for {method} is {min_budget} bytes" if min_budget is not None else ""
        super().__init__(f"no {method} plan fits a budget of {budget} bytes; {hint}".rstrip("; "))


@dataclass
class Plan:
    """A canonical strategy (Kusumoto §3) given by the lower-set sequence L_1 ≺ … ≺ L_k = V.

    Attributes:
        method, strategy: the planner that made it (``strategy`` is ``"tc"``/``"mc"`` for the DPs).
        lower_sets: L_1 ≺ … ≺ L_k = V as frozensets of node ids.
        cached: U_k = ∪ ∂(L_i), the values kept from the forward pass.
        overhead: recomputation cost Σ_{i<k} T(V_i \\ ∂(L_i)) (eq. 1 without the never-recomputed V_k).
        peak: M({L_1 ≺ … ≺ L_k}) of eq. (2), bytes (or of its liveness variant, see ``memory_model``).
        budget: the memory budget B the plan was solved for (``None`` where the method takes none).
        solve_seconds: wall time of the planner.
        info: method-specific facts (number of lower sets, time quantisation, search steps, …).
        memory_model: ``"paper"`` (eq. 2) or ``"liveness"`` (:func:`recompute.lowerset.block_memory`),
            the model ``peak`` and ``budget`` are expressed in.
    """

    method: str
    strategy: str | None
    lower_sets: list[frozenset[int]]
    cached: frozenset[int]
    overhead: int
    peak: int
    budget: int | None = None
    solve_seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    memory_model: str = "paper"

    @classmethod
    def from_sequence(
        cls,
        g: Graph,
        seq: Sequence[frozenset[int]] | Sequence[set[int]],
        *,
        method: str,
        strategy: str | None = None,
        budget: int | None = None,
        memory_model: str = "paper",
        **info: Any,
    ) -> "Plan":
        """Validate a lower-set sequence and evaluate it with eq. (1) and eq. (2) (or ``memory_model``)."""
        seq = [frozenset(s) for s in seq]
        lowerset.check_sequence(g, seq)
        return cls(
            method=method,
            strategy=strategy,
            lower_sets=seq,
            cached=lowerset.cached_set(g, seq),
            overhead=lowerset.overhead(g, seq),
            peak=lowerset.peak(g, seq, memory_model),
            budget=budget,
            info=dict(info),
            memory_model=memory_model,
        )

    @property
    def blocks(self) -> list[frozenset[int]]:
        """V_1, …, V_k."""
        return lowerset.blocks(self.lower_sets)

    @property
    def k(self) -> int:
        """Number of blocks."""
        return len(self.lower_sets)

    def recomputed(self) -> frozenset[int]:
        """Nodes the backward pass computes again: V \\ U_k minus the last block."""
        return self.lower_sets[-1] - self.cached - self.blocks[-1]

    def summary(self) -> str:
        strat = f"+{self.strategy}" if self.strategy else ""
        return (
            f"{self.method}{strat}: k={self.k} blocks, overhead={self.overhead}, "
            f"predicted peak={self.peak / 2**30:.3f} GiB, solved in {self.solve_seconds:.3f}s"
        )


Planner = Callable[..., Plan]
_REGISTRY: dict[str, Planner] = {}


def register(name: str) -> Callable[[Planner], Planner]:
    """Register ``fn(graph, *, budget=None, strategy=None, **options) -> Plan`` under ``name``."""

    def deco(fn: Planner) -> Planner:
        _REGISTRY[name] = fn
        return fn

    return deco


def methods() -> list[str]:
    """Names of the registered planning methods."""
    importlib.import_module(f"{__package__}.planners")  # importing the package registers them
    return sorted(_REGISTRY)


def plan(
    graph: Graph,
    method: str = "approxdp",
    *,
    strategy: str | None = None,
    budget: int | None = None,
    **options: Any,
) -> Plan:
    """Solve the general recomputation problem on ``graph`` with a registered ``method``.

    ``strategy`` (``"tc"`` time-centric / ``"mc"`` memory-centric, §4.4) applies to the DP methods;
    with ``budget=None`` they use the smallest budget for which a strategy exists. Raises
    :class:`InfeasibleBudget` (with the smallest feasible budget) when ``budget`` is too small.
    """
    check_graph(graph)
    check_budget(budget)
    check_method(method, strategy, options)
    names = methods()
    if method not in _REGISTRY:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(names)}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    start = time.perf_counter()
    result = _REGISTRY[method](graph, budget=budget, strategy=strategy, **options)
    result.solve_seconds = time.perf_counter() - start
    return result
