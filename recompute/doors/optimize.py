"""``recompute.optimize``: wrap a model so that its training steps follow a recomputation plan."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from recompute.doors import baselines
from recompute.doors.baselines import BaselineModule
from recompute.doors.execute import Executor
from recompute.core.graph import Graph
from recompute.planners.registry import AUTO, Door, Plan, default_cost_model, plan, spec
from recompute.doors.auto import choose
from recompute.capture.trace import Untraceable, trace
from recompute.capture.validate import check_arguments, check_budget, check_cost_model, check_inputs, check_model, check_rewrites, describe
from recompute.doors.wrapper import ModelWrapper, model_signature
from recompute.rewrites.pipeline import with_rewrites

__all__ = ["optimize", "RecomputeModule", "RetraceWarning", "CacheWarning", "CaptureWarning", "MAX_PLANS"]


class RecomputeModule(ModelWrapper):
    """A module that shares ``model``'s parameters and buffers and trains under a recomputation plan.

    Whenever autograd would record the step (grad enabled and a parameter or an input requires grad),
    the call runs a plan traced for what the step is: the inputs' shapes, strides, dtypes, devices and
    ``requires_grad``, the autocast state, and the model as it is now (:func:`~recompute.doors.wrapper.model_signature`: its
    submodules, their ``training`` flags, settings and hooks, the parameters' and buffers' layouts and
    ``requires_grad``). A call that differs in any of these traces and plans again (once; plans are
    cached), so ``eval()``/``train()`` on the wrapper or on any inner module, freezing a layer, a new
    batch size, channels-last inputs or weights, a replaced head or a changed dropout rate never reuse a
    plan made for another program (whose views would not fit the new strides, or whose ops are not the model's).
    Gradients flow to the parameters and to every input that requires grad, as in plain training.
    Otherwise (``torch.no_grad()``, nothing requires grad) the model is called unchanged, since nothing
    is kept for backward there. ``state_dict`` and ``load_state_dict`` are the model's own
    (:class:`~recompute.doors.wrapper.ModelWrapper`).
    """

    def __init__(self, model: torch.nn.Module, *, method: str, strategy: str | None, budget: int | None,
                 cost_model: str, plan_options: dict[str, Any], cost_options: dict[str, Any] | None = None,
                 recompute_late: bool = False, in_place: bool = False, recompute_at_peak: bool = False,
                 split_convolutions: bool | None = False):
        super().__init__(model)
        self.method, self.strategy, self.budget, self.recompute_late = method, strategy, budget, recompute_late
        self.in_place, self.recompute_at_peak, self.split_convolutions = in_place, recompute_at_peak, split_convolutions
        self.cost_model, self.plan_options, self.cost_options = cost_model, plan_options, dict(cost_options or {})
        self._executors: dict[tuple, Executor | _Captured] = {}
        self.last: Executor | _Captured | None = None
        self._last_key: tuple | None = None
        self._traced = 0  # traces so far (the plans kept are at most MAX_PLANS of them)
        _compiled_around(type(self))

    def __getstate__(self) -> dict[str, Any]:
        """Without the plans (``copy.deepcopy``, an EMA twin, ``pickle``): a copy plans again on its
        first training call; the traced programs hold compiled planner tables that do not copy."""
        state = self.__dict__.copy()
        state["_executors"], state["last"], state["_last_key"], state["_traced"] = {}, None, None, 0
        return state

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
            tuple((x.shape, x.stride(), x.dtype, x.device, x.requires_grad) for x in inputs),
            model_signature(self.model),
            tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices),
        )

    def prepare(self, *args: Any, **kwargs: Any) -> "Executor | _Captured":
        """Trace and plan for a call like this one (done lazily by ``forward``)."""
        return self._prepared(*_call_layout(self.model.forward, args, kwargs))

    def _prepared(self, tensors: tuple[torch.Tensor, ...], layout: tuple) -> "Executor | _Captured":
        check_inputs(tensors)
        key = (layout, self._program_key(tensors))
        if key not in self._executors:
            if len(self._executors) >= MAX_PLANS:
                # a setting that changes every call (a step counter on a module) would otherwise trace and
                # plan every step and keep every plan
                oldest = next(iter(self._executors))
                warnings.warn(f"{type(self.model).__name__} was traced and planned {self._traced + 1} times; this time "
                              f"because {_what_changed(self._last_key, key)}. A value that changes every step makes "
                              "every step trace again: keep it out of the module's attributes (a tensor buffer is "
                              f"not traced as a constant). Only the {MAX_PLANS} latest plans are kept.",
                              RetraceWarning, stacklevel=3)
                del self._executors[oldest]
            # a call with keyword or non-tensor arguments is traced as the model called with them fixed
            module = self.model if layout == _positional(len(tensors)) else _Call(self.model, layout)

            def trace_at(split: bool | frozenset[str]) -> Graph:
                return trace(module, tensors, cost_model=self.cost_model, split_convolutions=split, **self.cost_options)

            try:
                self._executors[key] = self._planned(trace_at, module)
            except Untraceable as e:
                # what a whole-step export cannot take (control flow on a tensor's value), TorchDynamo
                # captures in graphs, each planned on its own by the compile backend
                warnings.warn(f"{type(self.model).__name__}'s step could not be traced whole ({_first(e)}); it is "
                              "captured by TorchDynamo instead, each graph between its breaks planned on its own "
                              "(m.capture == 'dynamo')", CaptureWarning, stacklevel=3)
                self._executors[key] = _Captured(module, self._backend())
            self._traced += 1
        self.last, self._last_key = self._executors[key], key
        return self.last

    def _planned(self, trace_at: Callable[[bool | frozenset[str]], Graph], module: torch.nn.Module) -> Executor:
        """The step traced whole and planned: by ``auto`` (which chooses the splits and rewrites) or by
        the planner, with the rewrites asked for."""
        if self.method == AUTO:
            g, p = choose(trace_at, budget=self.budget, split_convolutions=self.split_convolutions,
                          **self.plan_options)
        else:
            g = trace_at(bool(self.split_convolutions))
            p = plan(g, self.method, strategy=self.strategy, budget=self.budget, **self.plan_options)
            p = with_rewrites(p, g, recompute_late=self.recompute_late, recompute_at_peak=self.recompute_at_peak,
                                in_place=self.in_place)
        return Executor(g, p, module)

    def _backend(self) -> Any:
        """``recompute.backend`` with this module's method and options (its eager runtime: bitwise)."""
        from recompute.doors.backend import backend

        auto = self.method == AUTO
        rewrites = {} if auto else {"recompute_late": self.recompute_late, "recompute_at_peak": self.recompute_at_peak,
                                    "in_place": self.in_place}
        return backend(self.method, strategy=self.strategy, budget=self.budget, cost_model=self.cost_model,
                       cost_options=self.cost_options or None, split_convolutions=self.split_convolutions if auto
                       else bool(self.split_convolutions), **rewrites, **self.plan_options)

    @property
    def capture(self) -> str | None:
        """How the most recent training call's step was captured: ``export`` (traced whole, one plan,
        the executor) or ``dynamo`` (TorchDynamo's graphs, each planned by ``recompute.backend``)."""
        return None if self.last is None else "dynamo" if isinstance(self.last, _Captured) else "export"

    def records_backward(self, inputs: tuple[torch.Tensor, ...]) -> bool:
        """Whether autograd would record a step on ``inputs``: only then is there a plan to follow."""
        if not torch.is_grad_enabled():
            return False
        return (any(p.requires_grad for p in self.model.parameters())
                or any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        tensors, layout = _call_layout(self.model.forward, args, kwargs)
        if not self.records_backward(tensors):
            return self.model(*args, **kwargs)
        return self._prepared(tensors, layout)(*tensors)


def _compiled_around(cls: type) -> None:
    """Inside a model under ``torch.compile``, dynamo would trace into ``cls.forward``'s tracing and
    planning (numba, FakeTensors) and fail: it is made to run it as it is, between the graphs it
    compiles (``torch.compiler.disable``). Done at the first construction, not at import: it imports
    torch._dynamo (seconds), which ``import recompute`` leaves to first use."""
    if not getattr(cls.forward, "_torchdynamo_disable", False):
        cls.forward = torch.compiler.disable(cls.forward)


MAX_PLANS = 8  # plans a RecomputeModule keeps (torch.compile's recompile limit is 8 too)


class _Captured:
    """A step TorchDynamo captures (``torch.compile`` with ``recompute.backend``), called like an
    executor: the model's graphs between its breaks, each planned. ``graph`` and ``plan`` are those of
    the graph planned last."""

    def __init__(self, module: torch.nn.Module, backend: Any):
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        self.backend = backend
        self.step = torch.compile(module, backend=backend, dynamic=False)

    def __call__(self, *tensors: torch.Tensor) -> Any:
        return self.step(*tensors)

    @property
    def graph(self) -> Graph | None:
        return self.backend.partitions[-1].graph if self.backend.partitions else None

    @property
    def plan(self) -> Plan | None:
        return self.backend.partitions[-1].plan if self.backend.partitions else None


def _first(e: BaseException) -> str:
    return str(e).strip().splitlines()[0]


class CaptureWarning(UserWarning):
    """An optimized model's step was captured by TorchDynamo, not traced whole."""


class RetraceWarning(UserWarning):
    """An optimized module traced and planned again more than :data:`MAX_PLANS` times."""


class CacheWarning(UserWarning):
    """A model that takes ``use_cache`` (a Hugging Face model) is trained with ``use_cache=False``."""


def _what_changed(old: tuple | None, new: tuple) -> str:
    """The first difference between two keys of :meth:`RecomputeModule._prepared`, in words."""
    if old is None:
        return "nothing was planned before"
    (old_layout, (old_inputs, (old_modules, old_hooks), old_autocast)) = old
    (layout, (inputs, (modules, hooks), autocast)) = new
    if old_layout != layout:
        return "the call's non-tensor arguments changed"
    if old_inputs != inputs:
        return "the inputs' shapes, strides, dtypes, devices or requires_grad changed"
    was = {entry[0]: entry for entry in old_modules}
    for name, kind, settings, module_hooks, tensors in modules:
        before = was.get(name)
        where = f"module `{name or 'the model'}` ({kind.__name__})"
        if before is None or before[1] is not kind:
            return f"{where} is new"
        prior = dict(before[2])
        changed = [_change(k, prior[k], v) if k in prior else f"{k} set to {v!r}" for k, v in settings
                   if prior.get(k, ...) != v]
        if changed:
            return f"{where} changed {', '.join(changed[:3])}"
        if before[3] != module_hooks:
            return f"{where} has other hooks"
        if before[4] != tensors:
            return f"{where} has parameters or buffers of another layout or requires_grad"
    if len(was) != len(modules):
        return "modules were removed"
    return "the global module hooks changed" if old_hooks != hooks else "the autocast state changed"


def _change(where: str, old: Any, new: Any) -> str:
    """``where old → new``, descending into signed config objects and dicts
    (:func:`~recompute.doors.wrapper.model_signature`: ``(type, ((key, setting), ...))``) to the first setting
    that differs: ``cfg.p 0.5 → 0.1``."""
    def signed(x: Any) -> bool:
        return type(x) is tuple and len(x) == 2 and isinstance(x[0], type) and type(x[1]) is tuple

    if signed(old) and signed(new) and old[0] is new[0]:
        before, after = dict(old[1]), dict(new[1])
        for key in [*before, *(k for k in after if k not in before)]:
            if before.get(key, ...) != after.get(key, ...):
                step = f"[{key!r}]" if issubclass(old[0], dict) else f".{key}"
                return _change(where + step, before.get(key, "unset"), after.get(key, "unset"))
    return f"{where} {old!r} → {new!r}"


@dataclass(frozen=True)
class _Slot:
    """Where a call's tensor argument goes: the step's input ``index`` (no tuple, so that it equals
    no constant argument)."""

    index: int


def _positional(n: int) -> tuple:
    """The layout of a call with ``n`` positional tensors and nothing else."""
    return tuple(_Slot(i) for i in range(n)), ()


def _call_layout(forward: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """A call's tensor arguments, in order, and the call with each of them replaced by its
    :class:`_Slot`: the other arguments (``None``, a flag, a scale) are constants of the traced step,
    so they are part of its key and must be hashable. The arguments are bound to ``forward``'s
    signature first, defaults filled in, so that ``m(x)``, ``m(x, None)`` and ``m(x, mask=None)`` are
    one call (and a call the model does not take fails as the plain call would)."""
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):  # no signature to bind to (a builtin): the call as written
        signature = None
    if signature is not None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("use_cache", False) is None:
            # a training step returns no key-value cache (a planned step returns tensors): as Hugging
            # Face's gradient checkpointing does, the model is called without one
            warnings.warn(f"{getattr(forward, '__qualname__', 'forward')} takes use_cache: a planned training step "
                          "returns tensors, not a key-value cache, so it is called with use_cache=False, as Hugging "
                          "Face's gradient checkpointing does (pass use_cache=False to say so yourself)", CacheWarning,
                          stacklevel=4)
            bound.arguments["use_cache"] = False
        args, kwargs = bound.args, bound.kwargs
    tensors: list[torch.Tensor] = []

    def slot(value: Any, where: str) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return _Slot(len(tensors) - 1)
        if any(isinstance(x, torch.Tensor) for x in tree_leaves(value)):
            raise TypeError(f"argument {where} holds tensors inside {describe(value)}; a planned step takes tensors as "
                            "arguments of their own. What to do: pass each tensor as an argument, or wrap the model "
                            "in a module whose forward takes them so.")
        try:
            hash(value)
        except TypeError:
            raise TypeError(f"argument {where} is {describe(value)}: a planned step takes tensors and hashable constants "
                            "(None, numbers, strings, tuples of them), which it is traced with. What to do: pass a "
                            "tuple instead, or store the value on the module.") from None
        return value

    layout = (tuple(slot(a, str(i)) for i, a in enumerate(args)),
              tuple((k, slot(v, repr(k))) for k, v in kwargs.items()))
    return tuple(tensors), layout


class _Call(torch.nn.Module):
    """``model`` called with one call's non-tensor and keyword arguments fixed (``layout``, from
    :func:`_call_layout`): its forward takes the tensors alone, as a traced step does."""

    def __init__(self, model: torch.nn.Module, layout: tuple):
        super().__init__()
        self.model, self.layout = model, layout
        self.train(model.training)

    def forward(self, *tensors: torch.Tensor) -> Any:
        def fill(value: Any) -> Any:
            return tensors[value.index] if isinstance(value, _Slot) else value

        args, kwargs = self.layout
        return self.model(*map(fill, args), **{k: fill(v) for k, v in kwargs})


def optimize(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
    *,
    method: str = AUTO,
    strategy: str | None = None,
    budget: int | None = None,
    cost_model: str | None = None,
    cost_options: dict[str, Any] | None = None,
    recompute_late: bool | None = None,
    in_place: bool | None = None,
    recompute_at_peak: bool | None = None,
    split_convolutions: bool | None = None,
    **plan_options: Any,
) -> RecomputeModule | BaselineModule:
    """Return a module that trains ``model`` with the plan of ``method``.

    By default (``method="auto"``, :mod:`recompute.doors.auto`) the plan a user should run: the
    least peak among the exact schedules whose step is modelled to take at most ``max_time`` (a
    plan option, default 1.3) × plain training's time, or, given ``budget`` (the memory budget in
    bytes), the least time within it. Every rewrite is considered and kept only where it lowers the
    peak (in place, late, at the peak; convolution backwards split where the peak needs it and the
    split gives the fused op's values bitwise), so ``recompute_late``, ``in_place`` and
    ``recompute_at_peak`` are left to it (None); ``split_convolutions=False``/``True`` splits none or
    every one. Time is priced by the ``measured`` cost model (``cost_model=None``): the step's ops
    timed on the device the model is on, once per op and shape (cached on disk,
    :class:`recompute.capture.timing.TimeCache`); ``cost_model="paper"`` prices by the paper's units (10 per
    convolution, 1 otherwise, a backward at twice its forward: :mod:`recompute.pricing.steptime`).

    Any other ``method`` is that planner's plan (the paper's: ``approxdp`` at the smallest feasible
    budget when ``budget`` is None), with the rewrites asked for (None: off). ``strategy`` and
    ``plan_options`` are the planner's (``recompute.planners.registry.spec(method)``): a planner
    takes only what its registry entry lists, and one it does not take is refused here, naming it.
    What is not given takes the planner's own default, the same as through :func:`recompute.plan`,
    :func:`recompute.backend` and the app (the DPs: ``strategy="tc"``, ``memory_model`` the
    simulator, so that the plan's peak is the simulated one of the step that runs). ``cost_model``
    prices T_v (:mod:`recompute.capture.costs`; None: the paper's for its planners), with ``cost_options``
    (e.g. ``measured``'s ``repeats``).
    ``recompute_late`` also computes cheap values the backward reads early and much later once more
    before the later read, where that lowers the step's peak (:func:`~recompute.rewrites.pipeline.with_late_recompute`).
    ``in_place`` frees each value at its last use and runs each pointwise op whose input dies there in
    that input's storage, as eager PyTorch does: a lower peak, bitwise the same step
    (:func:`~recompute.rewrites.pipeline.with_in_place`). ``recompute_at_peak`` also runs each recomputation right before its
    first reader and computes values the step holds across its peak again after it, through the
    ops that make them, while the peak falls (:func:`~recompute.rewrites.pipeline.with_peak_recompute`). ``split_convolutions``
    runs each convolution's backward as two ops, the weight's gradient first, so that its input can
    be freed or recomputed before the input's gradient is made (:func:`recompute.trace`); with
    ``recompute_at_peak`` it reaches VGG-19's floor (docs/library.md).

    A method of :mod:`recompute.doors.baselines` (``torch_checkpoint_blocks``, ``torch_sac``, ...) returns a
    :class:`~recompute.doors.baselines.BaselineModule` instead: the model under PyTorch's own method, no
    plan (it takes no ``budget``; ``torch_compile_budget`` has its ``budget_fraction``).

    ``example_inputs`` (the positional arguments of a call) plans eagerly (so a bad budget fails
    here, not in the first step); otherwise planning happens on the first training call. The module
    takes what the model takes: keyword arguments and non-tensor ones (``mask=None``, a flag) are
    constants of the traced step, and a call with others is traced and planned again. Use it in an ordinary loop::

        m = recompute.optimize(model, (x,))
        loss = crit(m(x), y); loss.backward(); opt.step()
    """
    check_model(model)
    check_arguments(example_inputs)
    check_budget(budget)
    cost_model = default_cost_model(method) if cost_model is None else cost_model
    check_cost_model(cost_model, cost_options)
    rewrites = check_rewrites({"recompute_late": recompute_late, "recompute_at_peak": recompute_at_peak,
                               "in_place": in_place}, split_convolutions, auto=method == AUTO)
    if method in baselines.names():
        for flag, on in rewrites.items():
            if on:
                raise ValueError(f"{flag} rewrites a plan's schedule; {method!r} is PyTorch's own method and runs none")
        if split_convolutions:
            raise ValueError(f"split_convolutions splits the traced step's convolution backwards; {method!r} is "
                             "PyTorch's own method and traces none")
        entry = baselines.spec(method)
        entry.check(strategy=strategy, budget=budget, options=plan_options)
        base = BaselineModule(model, method, plan_options)
        base.train(model.training)
        return base
    spec(method).check(Door.optimize, strategy=strategy, budget=budget, options=plan_options)
    wrapped = RecomputeModule(model, method=method, strategy=strategy, budget=budget,
                              cost_model=cost_model, plan_options=plan_options, cost_options=cost_options,
                              **rewrites, split_convolutions=split_convolutions if method == AUTO else bool(split_convolutions))
    wrapped.train(model.training)
    if example_inputs is not None:
        wrapped.prepare(*((example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs))
    return wrapped
