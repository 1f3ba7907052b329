"""``recompute.optimize``: wrap a model so that its training steps follow a recomputation plan."""

from __future__ import annotations

from typing import Any

import torch

from .baselines import BaselineModule
from .execute import Executor
from .graph import Graph
from .plan import Plan, plan, spec
from .trace import trace
from .validate import check_budget, check_inputs, check_method, check_model

__all__ = ["optimize", "RecomputeModule"]


class RecomputeModule(torch.nn.Module):
    """A module that shares ``model``'s parameters and buffers and trains under a recomputation plan.

    The model is traced and planned on the first training call for each input signature (shapes,
    dtypes, devices); evaluation (``eval()`` or ``torch.no_grad()``) calls the model unchanged, since
    nothing is kept for backward there.
    """

    def __init__(self, model: torch.nn.Module, *, method: str, strategy: str | None, budget: int | None,
                 cost_model: str, plan_options: dict[str, Any]):
        super().__init__()
        self.model = model
        self.method, self.strategy, self.budget = method, strategy, budget
        self.cost_model, self.plan_options = cost_model, plan_options
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

    def prepare(self, *inputs: torch.Tensor) -> Executor:
        """Trace and plan for inputs like these (done lazily by ``forward``)."""
        check_inputs(inputs)
        key = tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)
        if key not in self._executors:
            g = trace(self.model, inputs, cost_model=self.cost_model)
            p = plan(g, self.method, strategy=self.strategy, budget=self.budget, **self.plan_options)
            self._executors[key] = Executor(g, p, self.model)
        self.last = self._executors[key]
        return self.last

    def forward(self, *inputs: torch.Tensor) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*inputs)
        return self.prepare(*inputs)(*inputs)


def optimize(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...] | torch.Tensor | None = None,
    *,
    method: str = "approxdp",
    strategy: str | None = "tc",
    budget: int | None = None,
    cost_model: str = "paper",
    memory_model: str = "liveness",
    **plan_options: Any,
) -> RecomputeModule | BaselineModule:
    """Return a module that trains ``model`` with the plan of ``method`` (default: approximate DP,
    time-centric, at the smallest feasible budget when ``budget`` is None).

    ``memory_model`` applies to the DP methods: ``"liveness"`` (default) plans with what autograd
    really keeps, ``"paper"`` with the paper's eq. (2) (see :class:`recompute.memory_model.MemoryModel`).

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
    check_method(method, strategy, plan_options)
    if spec(method).wraps:
        if budget is not None:
            raise ValueError(f"{method!r} takes no budget in bytes (it plans nothing); its options: "
                             f"{', '.join(spec(method).options) or 'none'}")
        base = BaselineModule(model, method, spec(method).fn(model, **plan_options))
        base.train(model.training)
        return base
    if method in ("vanilla", "chen", "chen_greedy"):
        strategy = None
    else:
        plan_options["memory_model"] = memory_model
    wrapped = RecomputeModule(model, method=method, strategy=strategy, budget=budget,
                              cost_model=cost_model, plan_options=plan_options)
    wrapped.train(model.training)
    if example_inputs is not None:
        wrapped.prepare(*((example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs))
    return wrapped
