"""``recompute.optimize``: wrap a model so that its training steps follow a recomputation plan."""

from __future__ import annotations

from typing import Any

import torch

from . import baselines
from .baselines import BaselineModule
from .execute import Executor
from .graph import Graph
from .plan import DEFAULT_METHOD, Door, Plan, plan, spec
from .trace import trace
from .validate import check_budget, check_cost_model, check_flag, check_inputs, check_model

__all__ = ["optimize", "RecomputeModule"]


class RecomputeModule(torch.nn.Module):
    """A module that shares ``model``'s parameters and buffers and trains under a recomputation plan.

    Whenever autograd would record the step (grad enabled and a parameter or an input requires grad),
    the call runs a plan traced for what the step is: the inputs' shapes, dtypes, devices and
    ``requires_grad``, the ``training`` flag of every submodule, the parameters' ``requires_grad`` and
    the autocast state. A call that differs in any of these traces and plans again (once; plans are
    cached), so ``eval()``/``train()`` on the wrapper or on any inner module, freezing a layer or a new
    batch size never reuse a plan made for another program. Gradients flow to the parameters and to
    every input that requires grad, as in plain training. Otherwise (``torch.no_grad()``, nothing
    requires grad) the model is called unchanged, since nothing is kept for backward there.
    """

    def __init__(self, model: torch.nn.Module, *, method: str, strategy: str | None, budget: int | None,
                 cost_model: str, plan_options: dict[str, Any], cost_options: dict[str, Any] | None = None,
                 recompute_late: bool = False, in_place: bool = False):
        super().__init__()
        self.model = model
        self.method, self.strategy, self.budget, self.recompute_late = method, strategy, budget, recompute_late
        self.in_place = in_place
        self.cost_model, self.plan_options, self.cost_options = cost_model, plan_options, dict(cost_options or {})
        self._executors: dict[tuple, Executor] = {}
        self.last: Executor | None = None

    @property
    def graph(self) -> Graph | None:
        """The graph of the most recent training call."""
        return self.last.graph if self.last else None

    @property
    def plan(self) -> Plan | None:
        """The plan of the most recent training call."""
        return self.last.plan if self.last else None

    def _program_key(self, inputs: tuple[torch.Tensor, ...]) -> tuple:
        """Everything that changes the traced step besides the parameters' values."""
        devices = sorted({x.device.type for x in inputs} | {"cpu"})
        return (
            tuple((tuple(x.shape), x.dtype, x.device, x.requires_grad) for x in inputs),
            tuple(m.training for m in self.model.modules()),
            tuple(p.requires_grad for p in self.model.parameters()),
            tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices),
        )

    def prepare(self, *inputs: torch.Tensor) -> Executor:
        """Trace and plan for a step like this one (done lazily by ``forward``)."""
        check_inputs(inputs)
        key = self._program_key(inputs)
        if key not in self._executors:
            g = trace(self.model, inputs, cost_model=self.cost_model, **self.cost_options)
            p = plan(g, self.method, strategy=self.strategy, budget=self.budget, **self.plan_options)
            p = p.with_rewrites(g, recompute_late=self.recompute_late, in_place=self.in_place)
            self._executors[key] = Executor(g, p, self.model)
        self.last = self._executors[key]
        return self.last

    def records_backward(self, inputs: tuple[torch.Tensor, ...]) -> bool:
        """Whether autograd would record a step on ``inputs``: only then is there a plan to follow."""
        if not torch.is_grad_enabled():
            return False
        return (any(p.requires_grad for p in self.model.parameters())
                or any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs))

    def forward(self, *inputs: torch.Tensor) -> Any:
        if not self.records_backward(inputs):
            return self.model(*inputs)
        return self.prepare(*inputs)(*inputs)


def optimize(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...] | torch.Tensor | None = None,
    *,
    method: str = DEFAULT_METHOD,
    strategy: str | None = None,
    budget: int | None = None,
    cost_model: str = "paper",
    cost_options: dict[str, Any] | None = None,
    recompute_late: bool = False,
    in_place: bool = False,
    **plan_options: Any,
) -> RecomputeModule | BaselineModule:
    """Return a module that trains ``model`` with the plan of ``method`` (default: approximate DP, at
    the smallest feasible budget when ``budget`` is None).

    ``strategy`` and ``plan_options`` are the planner's (``recompute.plan.spec(method)``): a planner
    takes only what its registry entry lists, and one it does not take is refused here, naming it.
    What is not given takes the planner's own default, the same as through :func:`recompute.plan`,
    :func:`recompute.backend` and the app (the DPs: ``strategy="tc"``, ``memory_model`` the
    simulator, so that the plan's peak is the simulated one of the step that runs). ``cost_model``
    prices T_v (:mod:`recompute.costs`), with ``cost_options`` (e.g. ``measured``'s ``repeats``).
    ``recompute_late`` also computes cheap values the backward reads early and much later once more
    before the later read, where that lowers the step's peak (:meth:`Plan.with_late_recompute`).
    ``in_place`` frees each value at its last use and runs each pointwise op whose input dies there in
    that input's storage, as eager PyTorch does: a lower peak, bitwise the same step
    (:meth:`Plan.with_in_place`).

    A method of :mod:`recompute.baselines` (``torch_checkpoint_blocks``, ``torch_sac``, ...) returns a
    :class:`~recompute.baselines.BaselineModule` instead: the model under PyTorch's own method, no
    plan (it takes no ``budget``; ``torch_compile_budget`` has its ``budget_fraction``).

    ``example_inputs`` plans eagerly (so a bad budget fails here, not in the first step); otherwise
    planning happens on the first training call. Use it in an ordinary loop::

        m = recompute.optimize(model, (x,))
        loss = crit(m(x), y); loss.backward(); opt.step()
    """
    check_model(model)
    check_inputs(example_inputs, allow_none=True)
    check_budget(budget)
    check_cost_model(cost_model, cost_options)
    check_flag("recompute_late", recompute_late)
    check_flag("in_place", in_place)
    if method in baselines.names():
        for flag, on in (("recompute_late", recompute_late), ("in_place", in_place)):
            if on:
                raise ValueError(f"{flag} rewrites a plan's schedule; {method!r} is PyTorch's own method and runs none")
        entry = baselines.spec(method)
        entry.check(strategy=strategy, budget=budget, options=plan_options)
        base = BaselineModule(model, method, entry.fn(model, **plan_options))
        base.train(model.training)
        return base
    spec(method).check(Door.optimize, strategy=strategy, budget=budget, options=plan_options)
    wrapped = RecomputeModule(model, method=method, strategy=strategy, budget=budget,
                              cost_model=cost_model, plan_options=plan_options, cost_options=cost_options,
                              recompute_late=recompute_late, in_place=in_place)
    wrapped.train(model.training)
    if example_inputs is not None:
        wrapped.prepare(*((example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs))
    return wrapped
