"""Checks at the library's front door: a wrong argument fails at once, with a message that names it.

``recompute.trace``, ``recompute.optimize`` and ``recompute.plan`` call these first, so that a plain
function where a module belongs, a non-tensor input, a budget given as a string or a misspelt planner
option is reported as such, before any tracing or solving, instead of surfacing as an unrelated
``AttributeError`` deep inside ``torch.export`` or a planner (or not at all). Each check raises
``TypeError`` for an argument of the wrong kind and ``ValueError`` for a wrong value.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Mapping

import torch

from . import costs
from .graph import Graph
from .memory_model import PLANNING

__all__ = ["check_model", "check_inputs", "check_budget", "check_graph", "check_method", "check_cost_model"]

# planner options with a closed set of values (the others are checked against their default's type)
_CHOICES: dict[str, tuple[str, ...]] = {"memory_model": PLANNING}


def _describe(value: Any) -> str:
    """``a function 'f'``, ``a str '2GB'``: what the caller passed, briefly."""
    kind = type(value).__name__
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return f"a function {getattr(value, '__qualname__', repr(value))!r}"
    if isinstance(value, torch.nn.Module):
        return f"a module of type {kind}"
    text = repr(value)
    return f"a {kind} {text if len(text) <= 60 else text[:57] + '...'}"


def check_model(model: Any) -> None:
    """``model`` must be an ``nn.Module`` (its parameters, buffers and train mode are part of the step)."""
    if isinstance(model, torch.nn.Module):
        return
    hint = ""
    if callable(model):
        hint = ("; wrap the function in a module, e.g. class Net(nn.Module): def forward(self, x): return f(x) "
                "(with its weights as nn.Parameter attributes so that they are trained)")
    raise TypeError(f"model must be a torch.nn.Module, got {_describe(model)}{hint}")


def check_inputs(inputs: Any, *, allow_none: bool = False) -> None:
    """``inputs`` must be a tensor or a non-empty tuple/list of tensors: what ``forward`` is called with."""
    if inputs is None and allow_none:
        return
    items = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(items, (tuple, list)) or not items:
        raise TypeError(f"example inputs must be a tensor or a non-empty tuple/list of tensors, got {_describe(inputs)}")
    for i, x in enumerate(items):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"example input {i} is {_describe(x)}, not a tensor: every argument of the model's forward must be "
                "a tensor. Fix non-tensor arguments first, e.g. store them on the module or wrap it: "
                "class Fixed(nn.Module): def forward(self, x): return model(x, scale=2.0)"
            )


def check_budget(budget: Any) -> None:
    """``budget`` is ``None`` (the smallest feasible) or a positive number of bytes."""
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        hint = "; convert it first, e.g. budget=int(1.5 * 2**30) for 1.5 GiB" if isinstance(budget, str) else ""
        raise TypeError(f"budget must be a number of bytes (an int) or None, got {_describe(budget)}{hint}")
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes or None, got {budget!r}")


def check_graph(graph: Any) -> None:
    """``graph`` must be a :class:`~recompute.graph.Graph` (``recompute.trace`` or ``Graph.from_edges``)."""
    if not isinstance(graph, Graph):
        hint = "; trace the model first: recompute.plan(recompute.trace(model, inputs), ...)" if isinstance(
            graph, torch.nn.Module) else ""
        raise TypeError(f"graph must be a recompute.Graph (from recompute.trace or Graph.from_edges), got "
                        f"{_describe(graph)}{hint}")


def check_cost_model(cost_model: Any) -> None:
    """``cost_model`` must name one of :data:`recompute.costs.COST_MODELS`."""
    if cost_model not in costs.COST_MODELS:
        raise ValueError(f"unknown cost_model {cost_model!r}; choose one of {', '.join(costs.COST_MODELS)}")


def _options_of(method: str) -> dict[str, Any]:
    """The keyword options of planner ``method`` (besides budget and strategy) and their defaults."""
    from .plan import spec  # late: plan.py calls into this module

    params = inspect.signature(spec(method).fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name not in ("budget", "strategy")}


def _fits(value: Any, default: Any) -> bool:
    """Whether ``value`` is of the kind of the option's ``default`` (an int is a fine float)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, numbers.Integral):
        return isinstance(value, numbers.Integral)
    if isinstance(default, numbers.Real):
        return isinstance(value, numbers.Real)
    return default is None or isinstance(value, type(default))


def _is_count(default: Any) -> bool:
    """Integer options with a positive default (time_levels, max_lower_sets, grid, max_nodes) are counts."""
    return isinstance(default, numbers.Integral) and not isinstance(default, bool) and default > 0


def check_method(method: Any, strategy: Any = None, options: Mapping[str, Any] | None = None) -> None:
    """``method`` is a registered planner, ``strategy`` ``tc``/``mc``/None, and every option one the
    planner takes, of its default's type, a count at least 1, a ``memory_model`` one of its values."""
    from .plan import STRATEGIES, methods

    names = methods()
    if method not in names:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(names)}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)} (or None)")
    accepted = _options_of(method)
    for name, value in (options or {}).items():
        if name not in accepted:
            raise TypeError(f"planner {method!r} has no option {name!r}; its options: {', '.join(accepted) or 'none'}")
        if name in _CHOICES and value not in _CHOICES[name]:
            raise ValueError(f"planner {method!r}: {name}={value!r}; choose one of {', '.join(_CHOICES[name])}")
        default = accepted[name]
        if not _fits(value, default):
            raise TypeError(f"planner {method!r}: {name}={value!r} is {_describe(value)}; expected type "
                            f"{type(default).__name__}, like its default {default!r}")
        if _is_count(default) and value < 1:  # limits and grid sizes: 0 divides by zero, < 0 means nothing
            raise ValueError(f"planner {method!r}: {name}={value!r}; must be a positive integer (default {default})")
