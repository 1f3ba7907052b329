"""The ``Plan`` record and the planner registry: ``recompute.plan(graph, method=...)``."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Callable, Mapping, Sequence

from recompute.capture.validate import check_budget, check_graph, check_made_for, check_options, keyword_options
from recompute.core import lowerset
from recompute.core.graph import Graph
from recompute.pricing.blockcost import BlockCosts
from recompute.pricing.memory_model import PLANNING, MemoryModel
from recompute.pricing.schedule import Schedule, canonical
from recompute.pricing.simulate import simulate

__all__ = ["Plan", "PlannerSpec", "Door", "Unserved", "InfeasibleBudget", "register", "plan", "methods", "spec",
           "simulated_peak", "STRATEGIES", "DEFAULT_METHOD", "AUTO", "default_cost_model"]

STRATEGIES = ("tc", "mc")
DEFAULT_METHOD = "approxdp"  # the default planner of the doors that plan a graph (plan, partitions): the paper's
AUTO = "auto"  # the default of the doors that wrap a model (optimize, backend): recompute.planners.auto


def default_cost_model(method: str) -> str:
    """The cost model a door prices T_v by where none is given: the device's seconds for ``auto``, whose
    goal is a time allowance (:mod:`recompute.pricing.steptime`), the paper's units for the paper's planners."""
    return "measured" if method == AUTO else "paper"


class InfeasibleBudget(ValueError):
    """No canonical strategy fits the budget; ``min_budget`` is the smallest budget that has one."""

    def __init__(self, method: str, budget: int, min_budget: int | None):
        self.method, self.budget, self.min_budget = method, budget, min_budget
        hint = f"the smallest feasible budget for {method} is {min_budget} bytes" if min_budget is not None else ""
        super().__init__(f"no {method} plan fits a budget of {budget} bytes; {hint}".rstrip("; "))


@dataclass(frozen=True, eq=False)
class Plan:
    """A canonical strategy (Kusumoto §3) given by the lower-set sequence L_1 ≺ … ≺ L_k = V, immutable
    (a rewrite or a budget search makes another: ``dataclasses.replace``); one plan is one object.

    Attributes:
        method, strategy: the planner that made it (``strategy`` is ``"tc"``/``"mc"`` for the DPs).
        lower_sets: L_1 ≺ … ≺ L_k = V as frozensets of node ids.
        cached: U_k = ∪ ∂(L_i), the values kept from the forward pass.
        overhead: recomputation cost Σ_{i<k} T(V_i \\ ∂(L_i)) (eq. 1 without the never-recomputed V_k);
            the canonical schedule skips the ops whose results nothing reads, so it bounds what runs.
        peak: bytes at the peak of the step: on a traced graph the simulator's exact peak of the
            schedule that runs (``memory_model="simulator"``); on a graph built from edges,
            M({L_1 ≺ … ≺ L_k}) of eq. (2) or its liveness variant.
        budget: the memory budget B the plan was solved for (``None`` where the method takes none).
        solve_seconds: wall time of the planner.
        min_budget: the smallest budget the planner has a plan for, where it searched for it (the DPs
            with ``budget=None``); ``None`` otherwise.
        model_peak: the planner's own memory model's peak of this plan, where ``peak`` is the
            simulator's and the planner priced it otherwise (eq. (2), liveness, the MILP's stages).
        slots: the memory slots of a multi-recompute schedule (``None`` for a lower-set plan).
        info: method-specific diagnostics for display (number of lower sets, time quantisation,
            search steps, …); nothing outside the planner's own module and its experiment reads them.
        memory_model: what ``peak`` and ``budget`` are expressed in (:class:`~recompute.pricing.memory_model.MemoryModel`).
        schedule: the executable schedule of a plan that is no canonical strategy: it recomputes
            more than once (:mod:`recompute.planners.multirecompute`; such a plan carries the trivial
            sequence [V] and the schedule says what runs), or it is a lower-set plan's canonical
            schedule rewritten (:mod:`recompute.rewrites.pipeline`). ``None`` for a lower-set plan.
        time_ratio: the modelled time of the step that runs ÷ plain training's
            (:mod:`recompute.pricing.steptime`), where the planner priced it (``auto``); ``None`` otherwise.
    """

    method: str
    strategy: str | None
    lower_sets: list[frozenset[int]]
    cached: frozenset[int]
    overhead: int
    peak: int
    budget: int | None = None
    solve_seconds: float = 0.0
    min_budget: int | None = None
    model_peak: int | None = None
    slots: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    memory_model: MemoryModel = MemoryModel.paper
    schedule: Schedule | None = field(default=None, repr=False)
    time_ratio: float | None = None

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
        min_budget: int | None = None,
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
            min_budget=min_budget,
            info=dict(info),
            memory_model=memory_model,
        )

    def runs(self, graph: Graph) -> Schedule:
        """The schedule that runs ``graph`` under this plan: the planner's own (``schedule``), or the
        canonical schedule of the lower sets (:func:`recompute.pricing.schedule.canonical`), built once. The one
        builder every consumer calls: :func:`simulated_peak`, :mod:`recompute.doors.execute`, :mod:`recompute.doors.backend`.
        ``ValueError`` when the plan was made for another graph."""
        check_made_for(graph, self.lower_sets[-1], self.schedule.names() if self.schedule is not None else ())
        if self.schedule is not None:
            return self.schedule
        built = self.__dict__.get("_canonical")
        if built is None or built[0] is not graph:
            built = self.__dict__["_canonical"] = (graph, canonical(graph, self.lower_sets))
        return built[1]

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
        time = f", modelled time {self.time_ratio:.3f}× plain training's" if self.time_ratio is not None else ""
        return (
            f"{self.method}{strat}: k={self.k} blocks, overhead={self.overhead}, "
            f"predicted peak={self.peak / 2**30:.3f} GiB{time}, solved in {self.solve_seconds:.3f}s"
        )


Planner = Callable[..., Plan]


class Door(StrEnum):
    """The ways a user comes in to have a model planned. ``optimize``, ``backend`` and ``app`` plan
    through ``plan``, so a planner that refuses ``plan`` refuses them all."""

    plan = "plan"  # recompute.plan(graph, method) and recompute.execute(graph, plan)
    optimize = "optimize"  # recompute.optimize(model, inputs, method=...)
    backend = "backend"  # torch.compile(model, backend=recompute.backend(method))
    app = "app"  # python run.py method=...


class Unserved(ValueError):
    """A door asked for a planner that says in the registry that it cannot serve that door."""


@dataclass(frozen=True)
class PlannerSpec:
    """A registered planner and everything a door needs to know to call it.

    Attributes:
        fn: ``fn(graph, *, budget=None, [strategy=None,] **options) -> Plan``.
        defaults: the keyword options it takes besides ``budget`` and ``strategy``, with their
            defaults, read off its signature: the one home of every default, the same for every door
            (``memory_model=None`` is the simulator on a traced graph).
        takes_strategy: its signature has ``strategy`` (``"tc"``/``"mc"``, §4.4); a door given a
            strategy for a planner without one refuses it.
        takes_budget: its signature has ``budget``.
        searches_budget: its plans depend on the budget (the DPs): on a traced graph, :func:`plan`
            tightens the budget it gives the planner until the simulated peak fits the user's.
        simulator_default: its search prices blocks by ``memory_model``, the simulator by default on a
            traced graph: its peak and budget already mean what runs (the app passes it its
            ``memory_model``).
        emits_schedule: it writes its own :class:`~recompute.pricing.schedule.Schedule` (recomputing a value
            as often as it likes) and prices it with the simulator: :func:`plan` calls it as is.
        refuses: the doors it cannot serve, each with the reason the door gives.
    """

    name: str
    fn: Planner
    defaults: Mapping[str, Any]
    takes_strategy: bool
    takes_budget: bool
    searches_budget: bool = False
    simulator_default: bool = False
    emits_schedule: bool = False
    refuses: Mapping[Door, str] = field(default_factory=dict)

    @property
    def options(self) -> tuple[str, ...]:
        """The names of its keyword options besides ``budget`` and ``strategy``."""
        return tuple(self.defaults)

    @property
    def takes_memory_model(self) -> bool:
        return "memory_model" in self.defaults

    def serves(self, door: Door) -> bool:
        return door not in self.refuses and Door.plan not in self.refuses

    def check(self, door: Door, *, strategy: Any = None, budget: Any = None,
              options: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        """Refuse, before any work, a door the planner cannot serve, a ``strategy`` or ``budget`` it
        does not take and any option it does not take or of the wrong kind, naming the planner, the
        argument and what it does take."""
        if not self.serves(door):
            why = self.refuses.get(door) or self.refuses[Door.plan]
            served = ", ".join(d.value for d in Door if self.serves(d)) or "none"
            raise Unserved(f"planner {self.name!r} cannot serve the {door.value} door: {why} (it serves: {served})")
        owner, taken = f"planner {self.name!r}", self._taken()
        if strategy is not None:
            if not self.takes_strategy:
                raise TypeError(f"{owner} has no option 'strategy' (got strategy={strategy!r}); its options: "
                                f"{', '.join((*taken, *self.defaults)) or 'none'}")
            if strategy not in STRATEGIES:
                raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)} (or None)")
        if budget is not None and not self.takes_budget:
            raise TypeError(f"{owner} has no option 'budget'; its options: {', '.join(self.defaults) or 'none'}")
        check_options(owner, self.defaults, options or {}, taken, {"memory_model": PLANNING})

    def _taken(self) -> tuple[str, ...]:
        return (*(("budget",) if self.takes_budget else ()), *(("strategy",) if self.takes_strategy else ()))

    def solve(self, graph: Graph, budget: int | None, strategy: str | None, options: Mapping[str, Any]) -> Plan:
        """Call the planner with what it takes (``budget``, ``strategy`` only where its signature has them)."""
        given = {**({"budget": budget} if self.takes_budget else {}),
                 **({"strategy": strategy} if self.takes_strategy else {})}
        return self.fn(graph, **given, **options)


_REGISTRY: dict[str, PlannerSpec] = {}


def register(name: str, *, searches_budget: bool = False, simulator_default: bool = False,
             emits_schedule: bool = False, refuses: Mapping[Door | str, str] | None = None,
             ) -> Callable[[Planner], Planner]:  # fmt: skip
    """Register ``fn(graph, *, budget=None, [strategy=None,] **options) -> Plan`` under ``name``; its
    options and their defaults are read off its signature. ``refuses`` maps each door it cannot serve
    to the reason. Every door (:class:`Door`) then offers it without further edits."""

    def deco(fn: Planner) -> Planner:
        params = inspect.signature(fn).parameters
        _REGISTRY[name] = PlannerSpec(
            name, fn, keyword_options(fn, besides=("budget", "strategy")), takes_strategy="strategy" in params,
            takes_budget="budget" in params, searches_budget=searches_budget, simulator_default=simulator_default,
            emits_schedule=emits_schedule, refuses={Door(d): why for d, why in (refuses or {}).items()})
        return fn

    return deco


def methods() -> list[str]:
    """Names of the registered planners (PyTorch's own methods are :func:`recompute.doors.baselines.names`)."""
    return sorted(_REGISTRY)


# methods that are no planners but that a door above offers under the same argument (PyTorch's own
# checkpointing methods, recompute.doors.baselines): the name → what to do with it instead
_ELSEWHERE: dict[str, str] = {}


def elsewhere(name: str, hint: str) -> None:
    """Say that ``name`` names a method a door above the planners offers, and what to do with it: a
    planner door given it refuses it with ``hint``."""
    _ELSEWHERE[name] = hint


def spec(method: Any) -> PlannerSpec:
    """The registry entry of ``method``; ValueError naming the registered planners otherwise."""
    if not isinstance(method, str) or method not in _REGISTRY:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(methods())}"
                         + (f" ({method!r} is not a planner: {_ELSEWHERE[method]})" if method in _ELSEWHERE else ""))
    return _REGISTRY[method]


def simulated_peak(graph: Graph, p: Plan) -> int:
    """Exact peak (bytes) of the schedule of ``p`` (its canonical one for a lower-set plan) as
    :mod:`recompute.doors.execute` runs it."""
    return simulate(graph.program, p.runs(graph)).peak


def plan(
    graph: Graph,
    method: str = DEFAULT_METHOD,
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
    the schedule the executor runs (:mod:`recompute.pricing.simulate`), which is what ``measure`` reports;
    the planner's own memory model's value is kept in ``model_peak``, and a ``budget`` bounds
    the simulated peak. Planners that emit schedules (``revolve``, ``chen_recursive``, ``join_dp``)
    need a traced graph and price their schedules with the simulator themselves.
    """
    check_graph(graph)
    check_budget(budget)
    entry = spec(method)
    entry.check(Door.plan, strategy=strategy, budget=budget, options=options)
    start = time.perf_counter()
    if graph.program is None or entry.emits_schedule:
        result = entry.solve(graph, budget, strategy, options)
    else:
        result = _simulated(graph, entry, budget, strategy, options)
    return replace(result, solve_seconds=time.perf_counter() - start)


def _simulated(graph: Graph, entry: PlannerSpec, budget: int | None, strategy: str | None,
               options: dict[str, Any]) -> Plan:  # fmt: skip
    """Run the planner and price its plan with the simulator; for a budget, search the largest
    budget to give the planner whose plan's simulated peak fits it (each probe is one solve)."""

    def solve(b: int | None) -> Plan:
        p = entry.solve(graph, b, strategy, options)
        if p.memory_model == MemoryModel.simulator:
            return p  # costed by the simulator itself: its peak and budget already mean what runs
        return replace(p, model_peak=p.peak, info={**p.info, "model": p.memory_model}, peak=simulated_peak(graph, p),
                       memory_model=MemoryModel.simulator, budget=budget)

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
    # the planner's own smallest budget need not give the smallest simulated peak: the probes above it
    # may fit ``budget`` (and else say the smallest peak there is)
    return _loosest(solve, replace(_smallest(solve, best), budget=budget), budget)


def _smallest(solve: Callable[[int | None], Plan], first: Plan, probes: int = 6, step: float = 0.03) -> Plan:
    """With no budget: the planner's model is not the simulator, so its smallest budget need not give
    the smallest simulated peak. Probe budgets 3%, 6%, … above it and keep the smallest simulated
    peak (then the least overhead)."""
    base = int(first.min_budget or first.model_peak)
    best = first
    for j in range(1, probes):
        p = solve(int(base * (1 + step * j)))
        if (p.peak, p.overhead) < (best.peak, best.overhead):
            best = p
    return replace(best, budget=None, info={**best.info, "probes": probes})


def _loosest(solve: Callable[[int | None], Plan], tightest: Plan, budget: int) -> Plan:
    """Bisect the planner's budget between its own smallest one and ``budget`` (×2 of the model's
    peak): the plan with the least overhead whose simulated peak fits ``budget``."""
    lo = int(tightest.min_budget or tightest.model_peak)
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
    return replace(best, info={**best.info, "budget_probes": True})
