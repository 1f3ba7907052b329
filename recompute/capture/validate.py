"""Checks at the library's front door: a wrong argument fails at once, with a message that names it.

``recompute.trace``, ``recompute.optimize`` and ``recompute.plan`` call these first, so that a plain
function where a module belongs, a non-tensor input, a budget given as a string or a misspelt planner
option (:func:`check_options`, called by the registries of :mod:`recompute.planners.registry` and
:mod:`recompute.doors.baselines`) is reported as such, before any tracing or solving, instead of surfacing
as an unrelated ``AttributeError`` deep inside ``torch.export`` or a planner (or not at all). Each check raises
``TypeError`` for an argument of the wrong kind and ``ValueError`` for a wrong value.
"""

from __future__ import annotations

import inspect
import math
import numbers
import sys
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import torch

from recompute.capture import costs
from recompute.core.graph import Graph

__all__ = ["check_model", "check_inputs", "check_arguments", "check_budget", "check_flag", "check_limit", "check_graph",
           "check_rewrites", "check_made_for", "check_split_names", "check_cost_model", "check_options", "keyword_options", "describe"]

# planner options with a closed set of values (the others are checked against their default's type)


def describe(value: Any) -> str:
    """``a function 'f'``, ``a str '2GB'``: what the caller passed, briefly."""
    kind = type(value).__name__
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return f"a function {getattr(value, '__qualname__', repr(value))!r}"
    if isinstance(value, torch.nn.Module):
        return f"a module of type {kind}"
    text = repr(value)
    return f"a {kind} {text if len(text) <= 60 else text[:57] + '...'}"


def check_model(model: Any) -> None:
    """``model`` must be an ``nn.Module`` (its parameters, buffers and train mode are part of the step),
    not one sharded or replicated for data parallelism already: planning runs its forward once, which
    FSDP2 takes for its lazy initialization, and DDP's forward holds its buckets' hooks."""
    if isinstance(model, torch.nn.Module):
        _check_not_distributed(model)
        return
    hint = ""
    if callable(model):
        hint = ("; wrap the function in a module, e.g. class Net(nn.Module): def forward(self, x): return f(x) "
                "(with its weights as nn.Parameter attributes so that they are trained)")
    raise TypeError(f"model must be a torch.nn.Module, got {describe(model)}{hint}")


def check_inputs(inputs: Any) -> None:
    """``inputs`` must be a tensor or a non-empty tuple/list of tensors: what ``forward`` is called with."""
    items = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(items, (tuple, list)) or not items:
        raise TypeError(f"example inputs must be a tensor or a non-empty tuple/list of tensors, got {describe(inputs)}")
    for i, x in enumerate(items):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"example input {i} is {describe(x)}, not a tensor: every argument of the traced forward must be "
                "a tensor. Fix non-tensor arguments first, e.g. store them on the module or wrap it: "
                "class Fixed(nn.Module): def forward(self, x): return model(x, scale=2.0) "
                "(recompute.optimize does this for you: it traces each call with its other arguments fixed)"
            )


def check_arguments(args: Any) -> None:
    """``args`` is ``None``, a tensor, or a tuple/list of arguments to call ``forward`` with."""
    if args is not None and not isinstance(args, (torch.Tensor, tuple, list)):
        raise TypeError(f"example inputs must be a tensor or a tuple/list of the forward's arguments, got {describe(args)}")


def check_budget(budget: Any) -> None:
    """``budget`` is ``None`` (the smallest feasible) or a positive number of bytes."""
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        hint = "; convert it first, e.g. budget=int(1.5 * 2**30) for 1.5 GiB" if isinstance(budget, str) else ""
        raise TypeError(f"budget must be a number of bytes (an int) or None, got {describe(budget)}{hint}")
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes or None, got {budget!r}")


def check_flag(name: str, value: Any) -> None:
    """An on/off option (``recompute_late``, ``split_convolutions``) is a bool: a string such as
    ``"no"`` would read as on."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_limit(limit: Any) -> None:
    """``limit`` (:func:`~recompute.rewrites.pipeline.with_peak_recompute`) is a number of cost units from 0 up, or
    ``math.inf``: NaN fails every comparison with the cost added, so it would mean no limit."""
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise TypeError(f"limit must be a number of cost units (T_v) or math.inf, got {describe(limit)}")
    if math.isnan(limit) or limit < 0:
        raise ValueError(f"limit must be a non-negative number of cost units (T_v of the graph's cost model), "
                         f"or math.inf for no limit; got {limit!r}")


def check_split_names(names: Collection[str], convolutions: Sequence[str]) -> None:
    """Each name of ``split_convolutions`` is one of the traced step's ``convolution_backward`` nodes
    (``convolutions``): a name of another model or a misspelt one would split nothing, without a word."""
    unknown = sorted(set(names) - set(convolutions))
    if not unknown:
        return
    shown = ", ".join(convolutions[:6]) + (f", ... ({len(convolutions)} in all)" if len(convolutions) > 6 else "")
    raise ValueError(f"split_convolutions names {', '.join(map(repr, unknown))}, not a convolution backward of the "
                     f"traced step; its convolution backwards: {shown or 'none'} (recompute.rewrites.peak.needed_splits "
                     "names those a schedule needs split), or split_convolutions=True for all of them")


def check_made_for(graph: Graph, nodes: frozenset[int], ops: Iterable[str]) -> None:
    """A plan is run on the graph it was planned for: its lower sets' last, V, is ``graph``'s nodes,
    and its schedule (``ops``: the ops it runs and reads) names only ops of ``graph``'s step. Another
    graph's plan fails deep inside with a ``KeyError``, or runs a step of the wrong model."""
    problem = f"its lower sets cover {len(nodes)} nodes, this graph has {graph.n}" if nodes != graph.nodes else ""
    if not problem and graph.program is not None:
        known = {n.name for n in graph.program.joint.gm.graph.nodes}
        missing = sorted(set(ops) - known)
        if missing:
            problem = (f"its schedule names {', '.join(map(repr, missing[:3]))}{', ...' if len(missing) > 3 else ''}, "
                       "which this graph's step does not have")
    if problem:
        raise ValueError(f"this plan was made for another graph ({problem}); plan this graph: "
                         "recompute.plan(graph, method, ...), and run or price the plan with the graph it was made for")


def check_rewrites(given: dict[str, Any], split_convolutions: Any, *, auto: bool) -> dict[str, bool]:
    """The schedule rewrites a door was given (``recompute_late``, ``recompute_at_peak``, ``in_place``:
    None where left out) and ``split_convolutions``, each None or a bool; ``auto`` (the planner that
    chooses them itself) takes none of the rewrites. Returns each rewrite on or off."""
    for flag, on in {**given, "split_convolutions": split_convolutions}.items():
        if on is not None:
            check_flag(flag, on)
    if auto and (chosen := [flag for flag, on in given.items() if on is not None]):
        raise ValueError(f"method 'auto' chooses the schedule rewrites itself, keeping each where it lowers the peak; "
                         f"leave {', '.join(chosen)} out, or name a planner to apply them to "
                         "(method='approxdp', strategy='tc'|'mc')")
    return {flag: bool(on) for flag, on in given.items()}


def _check_not_distributed(model: torch.nn.Module) -> None:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    sharded = [name or "the model" for name, m in model.named_modules()
               if fsdp is not None and isinstance(m, fsdp.FSDPModule)]
    if sharded:
        raise ValueError(f"{', '.join(sharded[:3])}{', …' if len(sharded) > 3 else ''} of {type(model).__name__} is "
                         "sharded by FSDP2's fully_shard already; planning runs the forward once, which FSDP takes for "
                         "its lazy initialization. What to do: optimize before fully_shard, e.g. for each block "
                         "model.blocks[i] = recompute.optimize(block, (x,)); fully_shard(model.blocks[i]); then "
                         "fully_shard(model)")
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    if ddp is not None and isinstance(model, ddp.DistributedDataParallel):
        raise ValueError("the model is wrapped in DistributedDataParallel already. What to do: optimize the module "
                         "before wrapping it: DDP(recompute.optimize(model, (x,)))")


def check_graph(graph: Any) -> None:
    """``graph`` must be a :class:`~recompute.core.graph.Graph` (``recompute.trace`` or ``Graph.from_edges``)."""
    if not isinstance(graph, Graph):
        hint = "; trace the model first: recompute.plan(recompute.trace(model, inputs), ...)" if isinstance(
            graph, torch.nn.Module) else ""
        raise TypeError(f"graph must be a recompute.Graph (from recompute.trace or Graph.from_edges), got "
                        f"{describe(graph)}{hint}")


def check_cost_model(cost_model: Any, options: dict[str, Any] | None = None) -> None:
    """``cost_model`` must name one of :data:`recompute.capture.costs.COST_MODELS`, and ``options`` be among
    the keyword-only parameters it takes."""
    if cost_model not in costs.COST_MODELS:
        raise ValueError(f"unknown cost_model {cost_model!r}; choose one of {', '.join(costs.COST_MODELS)}")
    takes = keyword_options(costs.COST_MODELS[cost_model])
    unknown = sorted(set(options or ()) - set(takes))
    if unknown:
        raise ValueError(f"cost_model {cost_model!r} takes {', '.join(takes) or 'no options'}; got {', '.join(unknown)}")


def keyword_options(fn: Callable[..., Any], *, besides: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keyword-only parameters of ``fn`` (but ``besides``) and their defaults: the options a
    planner or a baseline takes, read off its signature so that no list of them can drift."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name not in besides}


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


def check_options(owner: str, accepted: Mapping[str, Any], options: Mapping[str, Any],
                  taken: tuple[str, ...] = (), choices: Mapping[str, tuple[str, ...]] | None = None) -> None:  # fmt: skip
    """Every option in ``options`` is one ``owner`` (``"planner 'chen'"``) takes (a key of ``accepted``,
    whose values are the defaults), of its default's type, a count at least 1, one of its ``choices``
    where the owner has a closed set (a planner's ``memory_model``). The refusal names the owner, the option and what it does take (``taken`` first:
    the arguments every door passes, like ``budget``)."""
    for name, value in options.items():
        if name not in accepted:
            takes = ", ".join((*taken, *accepted)) or "none"
            raise TypeError(f"{owner} has no option {name!r}; its options: {takes}")
        if choices and name in choices and value not in choices[name]:
            raise ValueError(f"{owner}: {name}={value!r}; choose one of {', '.join(choices[name])}")
        default = accepted[name]
        if not _fits(value, default):
            raise TypeError(f"{owner}: {name}={value!r} is {describe(value)}; expected type "
                            f"{type(default).__name__}, like its default {default!r}")
        if _is_count(default) and value < 1:  # limits and grid sizes: 0 divides by zero, < 0 means nothing
            raise ValueError(f"{owner}: {name}={value!r}; must be a positive integer (default {default})")
