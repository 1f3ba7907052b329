"""The ``Plan`` record and the planner registry: ``recompute.plan(graph, method=...)``."""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import lowerset
from .blockcost import BlockCosts
from .graph import Graph
from .memory_model import MemoryModel
from .schedule import Schedule
from .validate import check_budget, check_graph, check_method

if TYPE_CHECKING:
    from .schedule import Schedule

__all__ = ["Plan", "PlannerSpec", "InfeasibleBudget", "register", "plan", "methods", "spec", "simulated_peak", "STRATEGIES"]

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
        peak: bytes at the peak of the step: on a traced graph the simulator's exact peak of the
            schedule that runs (``memory_model="simulator"``); on a graph built from edges,
            M({L_1 ≺ … ≺ L_k}) of eq. (2) or its liveness variant.
        budget: the memory budget B the plan was solved for (``None`` where the method takes none).
        solve_seconds: wall time of the planner.
        info: method-specific facts (number of lower sets, time quantisation, search steps, …).
        memory_model: what ``peak`` and ``budget`` are expressed in (:class:`~recompute.memory_model.MemoryModel`).
        schedule: the executable schedule of a plan that is no canonical strategy (it recomputes
            more than once: :mod:`recompute.planners.multirecompute`); such a plan carries the trivial
            sequence [V] and the schedule says what runs. ``None`` for a lower-set plan.
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
    memory_model: MemoryModel = MemoryModel.paper
    schedule: Schedule | None = field(default=None, repr=False)

    @classmethod
    def from_sequence(
        cls,
        g: Graph,
        seq: Sequence[frozenset[int]] | Sequence[set[int]],
        *,
        method: str,
        strategy: str | None = None,
        budget: int | None = None,
        memory_model: MemoryModel = MemoryModel.paper,
        **info: Any,
    ) -> "Plan":
        """Validate a lower-set sequence and evaluate it with eq. (1) and eq. (2) (or ``memory_model``)."""
        seq = [frozenset(s) for s in seq]
        lowerset.check_sequence(g, seq)
        memory_model = MemoryModel.parse(memory_model)
        return cls(
            method=method,
            strategy=strategy,
            lower_sets=seq,
            cached=lowerset.cached_set(g, seq),
            overhead=lowerset.overhead(g, seq),
            peak=memory_model.peak(g, seq),
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


@dataclass(frozen=True)
class PlannerSpec:
    """A registered planner and what it takes.

    Attributes:
        fn: ``fn(graph, *, budget=None, strategy=None, **options) -> Plan``.
        options: the keyword options it accepts besides ``budget`` and ``strategy``.
        searches_budget: its plans depend on the budget (the DPs): on a traced graph, :func:`plan`
            tightens the budget it gives the planner until the simulated peak fits the user's.
        simulator_default: on a traced graph its memory model is the simulator by default
            (``memory_model="simulator"``): its peak and budget already mean what runs.
        simulates: on a traced graph the planner itself prices its plan with the simulator and fits
            the budget (its ``peak`` is already the simulated one): :func:`plan` calls it as is.
        wraps: a baseline of :mod:`recompute.baselines`, no planner: ``fn(model, **options)`` returns
            the forward of the model wrapped by one of PyTorch's own methods; :func:`recompute.optimize`
            runs it, :func:`plan` refuses it.
    """

    name: str
    fn: Planner
    options: tuple[str, ...]
    searches_budget: bool
    simulator_default: bool = False
    simulates: bool = False
    wraps: bool = False


_REGISTRY: dict[str, PlannerSpec] = {}


def register(name: str, *, searches_budget: bool = False, simulator_default: bool = False,
             simulates: bool = False, wraps: bool = False) -> Callable[[Planner], Planner]:
    """Register ``fn(graph, *, budget=None, strategy=None, **options) -> Plan`` (with ``wraps``:
    ``fn(model, **options)``, a baseline) under ``name``; its options are read off its signature."""

    def deco(fn: Planner) -> Planner:
        params = inspect.signature(fn).parameters
        options = tuple(k for k, v in params.items() if v.kind is v.KEYWORD_ONLY and k not in ("budget", "strategy"))
        _REGISTRY[name] = PlannerSpec(name, fn, options, searches_budget, simulator_default, simulates, wraps)
        return fn

    return deco


def methods() -> list[str]:
    """Names of the registered methods: the planners and PyTorch's own methods (:mod:`recompute.baselines`)."""
    importlib.import_module(f"{__package__}.planners")  # importing the package registers them
    importlib.import_module(f"{__package__}.baselines")
    return sorted(_REGISTRY)


def spec(method: str) -> PlannerSpec:
    """The registry entry of ``method``; ValueError naming the registered ones otherwise."""
    names = methods()
    if method not in _REGISTRY:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(names)}")
    return _REGISTRY[method]


def simulated_peak(graph: Graph, p: Plan) -> int:
    """Exact peak (bytes) of the schedule of ``p`` (its canonical one for a lower-set plan) as
    :mod:`recompute.execute` runs it."""
    from .schedule import canonical
    from .simulate import simulate

    return simulate(graph.program, p.schedule if p.schedule is not None else canonical(graph, p.lower_sets)).peak


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

    On a traced graph (``recompute.trace``) the plan's ``peak`` is the simulator's: the exact peak of
    the schedule the executor runs (:mod:`recompute.simulate`), which is what ``measure`` reports;
    the planner's own memory model's value is kept in ``info["model_peak"]``, and a ``budget`` bounds
    the simulated peak. Planners that emit schedules (``revolve``, ``chen_recursive``, ``join_dp``)
    need a traced graph and price their schedules with the simulator themselves.
    """
    check_graph(graph)
    check_budget(budget)
    check_method(method, strategy, options)
    entry = spec(method)
    if entry.wraps:
        raise ValueError(f"{method!r} is one of PyTorch's own checkpointing methods: it wraps the module and "
                         f"plans no schedule; use recompute.optimize(model, inputs, method={method!r})")
    start = time.perf_counter()
    if graph.program is None or entry.simulates:
        result = entry.fn(graph, budget=budget, strategy=strategy, **options)
    else:
        result = _simulated(graph, entry, budget, strategy, options)
    result.solve_seconds = time.perf_counter() - start
    return result


def _simulated(graph: Graph, entry: PlannerSpec, budget: int | None, strategy: str | None,
               options: dict[str, Any]) -> Plan:  # fmt: skip
    """Run the planner and price its plan with the simulator; for a budget, search the largest
    budget to give the planner whose plan's simulated peak fits it (each probe is one solve)."""

    def solve(b: int | None) -> Plan:
        p = entry.fn(graph, budget=b, strategy=strategy, **options)
        if p.memory_model == MemoryModel.simulator:
            return p  # costed by the simulator itself: its peak and budget already mean what runs
        p.info["model_peak"], p.info["model"] = p.peak, p.memory_model
        p.peak, p.memory_model = simulated_peak(graph, p), MemoryModel.simulator
        p.budget = budget
        return p

    if entry.simulator_default and options.get("memory_model") in (None, MemoryModel.simulator):
        if BlockCosts.of(graph) is not None:
            return solve(budget)
        options = {**options, "memory_model": MemoryModel.liveness}  # not decomposable: plan, then price (below)
    best = solve(None)
    if budget is None and entry.searches_budget:
        return _smallest(solve, best)
    if budget is None or best.peak <= budget:
        if budget is not None and entry.searches_budget:
            best = _loosest(solve, best, budget)
        return best
    if not entry.searches_budget:
        raise InfeasibleBudget(entry.name, budget, best.peak)
    return _loosest(solve, best, budget)


def _smallest(solve: Callable[[int | None], Plan], first: Plan, probes: int = 6, step: float = 0.03) -> Plan:
    """With no budget: the planner's model is not the simulator, so its smallest budget need not give
    the smallest simulated peak. Probe budgets 3%, 6%, … above it and keep the smallest simulated
    peak (then the least overhead)."""
    base = int(first.info.get("min_budget") or first.info["model_peak"])
    best = first
    for j in range(1, probes):
        p = solve(int(base * (1 + step * j)))
        if (p.peak, p.overhead) < (best.peak, best.overhead):
            best = p
    best.budget = None
    best.info["probes"] = probes
    return best


def _loosest(solve: Callable[[int | None], Plan], tightest: Plan, budget: int) -> Plan:
    """Bisect the planner's budget between its own smallest one and ``budget`` (×2 of the model's
    peak): the plan with the least overhead whose simulated peak fits ``budget``."""
    lo = int(tightest.info.get("min_budget") or tightest.info["model_peak"])
    if tightest.peak > budget:
        raise InfeasibleBudget(tightest.method, budget, tightest.peak)
    hi = max(lo, 2 * budget)
    best = tightest
    for _ in range(12):
        if hi - lo <= max(1, lo // 1000):
            break
        mid = (lo + hi) // 2
        try:
            p = solve(mid)
        except InfeasibleBudget:
            lo = mid
            continue
        if p.peak <= budget:
            lo = mid
            if (p.overhead, p.peak) < (best.overhead, best.peak):
                best = p
        else:
            hi = mid
    best.info["budget_probes"] = True
    return best
