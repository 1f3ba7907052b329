"""``recompute.trace``: extract G = (V, E) with costs from an ``nn.Module``.

The whole training step is exported as one functional ATen graph (:mod:`recompute.capture.joint`): the
forward ops, the backward ops with the forward op each belongs to, BatchNorm's new running statistics
and the parameter gradients as outputs. Every shape is known from FakeTensor propagation, so tracing
at paper scale allocates no activation. The forward half is then condensed into the paper's V:

* one node per tensor-producing operation that depends on the user inputs;
* ``getitem`` of a multi-output op and view ops (``view``, ``t``, ``expand``…) belong to the node whose
  storage they alias, so they neither create bogus nodes nor hide a dependency;
* computations on parameters and buffers alone (BatchNorm's ``num_batches_tracked + 1``, weight
  transposes) and views of the inputs are not in V: they run once per step, before the forward pass.

Each backward op belongs to the node of V that owns the forward op whose ``grad_fn`` ran it.
"""

from __future__ import annotations

import operator
import re
import time as _time
import traceback
import warnings
from pathlib import Path
from dataclasses import dataclass, field
from collections.abc import Collection
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from recompute.capture import costs
from recompute.capture.convsplit import SPLIT_FROM, split_convolution_backwards
from recompute.core.fxnodes import is_random, output_tensors
from recompute.core.storage import tensor_bytes
from recompute.capture.joint import JointProgram, StepError, trace_step
from recompute.core.graph import Graph
from recompute.capture.validate import check_cost_model, check_flag, check_inputs, check_model, check_split_names
from recompute.capture.workspace import step_workspace

__all__ = ["trace", "graph_of", "TraceError", "Untraceable", "HookWarning", "Program"]


class TraceError(RuntimeError):
    """The model could not be traced; the message names the op or line and what to do."""


class Untraceable(TraceError):
    """The step's export met what a whole-step trace cannot take (Python control flow on a tensor's
    value, ``.item()``) where the model itself runs: TorchDynamo can capture it, in graphs."""


@dataclass(eq=False)
class Program:
    """The executable side of a traced :class:`Graph`: the joint graph and V's place in it.

    Attributes:
        joint: the training step's joint graph (:class:`recompute.capture.joint.JointProgram`).
        group: fx node name → the id of its node in V, for every forward fx node in V (views and
            getitems included).
        owner: backward fx node name → the node of V it belongs to (the owner of the forward op
            whose ``grad_fn`` ran it; ops of a ``grad_fn`` outside V go with the op before them).
        members: for each node of V, its forward fx nodes in execution order (the op first).
        prologue: forward fx nodes outside V, run once per step before the forward pass:
            computations on parameters and buffers alone, and views of the inputs.
        loss: whether the traced step ends in a loss (``trace(..., loss_fn=...)``).
        workspace: joint fx node name → the bytes its op allocates and frees inside itself on the
            device (:mod:`recompute.capture.workspace`; measured where the step runs on real tensors of a CUDA
            device or the CPU, empty on FakeTensors of the CPU). The simulator adds them at the op's step.
        op_seconds: forward fx node name → its op's seconds, where the ``measured`` cost model priced
            the graph (empty otherwise): what :mod:`recompute.rewrites.remat` then prices a recomputation by.
        time_model: the :class:`~recompute.capture.timing.TimeModel` (or extrapolation) that priced it, where
            the ``measured`` cost model did (None otherwise): the seconds of any schedule's ops
            (:func:`recompute.pricing.steptime.step_time`).
    """

    joint: JointProgram
    group: dict[str, int]
    members: list[list[fx.Node]]
    prologue: list[fx.Node]
    owner: dict[str, int]
    loss: bool = False
    trace_seconds: float = 0.0
    workspace: dict[str, int] = field(default_factory=dict)
    op_seconds: dict[str, float] = field(default_factory=dict)
    time_model: Any = None

    @property
    def gm(self) -> fx.GraphModule:
        return self.joint.gm

    @property
    def module(self) -> torch.nn.Module | None:
        return self.joint.module

    @property
    def params(self) -> dict[str, str]:
        return self.joint.params

    @property
    def buffers(self) -> dict[str, str]:
        return self.joint.buffers

    @property
    def user_inputs(self) -> list[str]:
        return self.joint.user_inputs

    @property
    def user_outputs(self) -> list[fx.Node]:
        return self.joint.user_outputs


def _is_view(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def _user_frame(exc: BaseException) -> str | None:
    """The innermost ``File ..., line N`` of the exception that is not inside torch: the user's line."""
    text = "".join(traceback.format_exception(exc))
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', text)
    ours = str(Path(__file__).parent)
    user = [f for f in frames if "/torch/" not in f[0] and not f[0].startswith(("<", ours))]
    if not user:
        return None
    path, line, func, code = user[-1]
    return f'{path}:{line} in {func}: "{code.strip()}"'


def _eager_failure(model: torch.nn.Module, args: tuple, loss_fn: Callable[[Any], torch.Tensor] | None) -> Exception | None:
    """The error plain PyTorch raises on this step, if it raises one (real inputs only; on copies of
    the buffers, without grad): then the inputs or the model are wrong, not tracing."""
    if any(isinstance(x, FakeTensor) for x in args):
        return None
    buffers = {name: b.clone() for name, b in model.named_buffers(remove_duplicate=False)}
    try:
        with torch.no_grad():
            out = torch.func.functional_call(model, buffers, args, strict=False)
            if loss_fn is not None:
                loss_fn(out)
    except Exception as exc:  # whatever plain PyTorch raises is the user's error to see
        return exc
    return None


def _dtype_hint(model: torch.nn.Module, args: tuple) -> str:
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    odd = [f"input {i} is {x.dtype}" for i, x in enumerate(args) if x.is_floating_point() and dtypes and x.dtype not in dtypes]
    if not odd:
        return ""
    have = ", ".join(sorted(str(d) for d in dtypes))
    return f" ({'; '.join(odd)} while the parameters are {have}: cast one to the other, e.g. x.to({have.split(',')[0]}))"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _export(model: torch.nn.Module, args: tuple, loss_fn: Callable[[Any], torch.Tensor] | None) -> JointProgram:
    name = type(model).__name__
    try:
        return trace_step(model, args, loss_fn)
    except StepError as exc:
        raise TraceError(f"cannot plan {name}: {exc}") from exc
    except Exception as exc:  # torch raises many different types here; all mean "not traceable"
        own = _eager_failure(model, args, loss_fn)
        if own is not None:
            where = _user_frame(own)
            raise TraceError(
                f"{name} fails on these inputs without recompute too: {type(own).__name__}: {_first_line(own)}"
                + (f"\n  at {where}" if where else "")
                + f"\nWhat to do: fix the inputs or the model as plain PyTorch asks{_dtype_hint(model, args)}; "
                "then plan again."
            ) from own
        where = _user_frame(exc)
        if "use_reentrant=True, torch.utils.checkpoint is incompatible" in str(exc):
            raise TraceError(
                f"{name} checkpoints a region itself with torch.utils.checkpoint(use_reentrant=True), whose backward "
                "a traced step cannot run" + (f"\n  at {where}" if where else "")
                + "\nWhat to do: checkpoint with use_reentrant=False (what PyTorch recommends; Hugging Face's "
                "gradient_checkpointing_enable() does by default), or turn the model's own checkpointing off: the plan "
                "decides what is recomputed."
            ) from exc
        if "convert all Tensors to FakeTensors" in str(exc):
            raise TraceError(
                f"{name}.forward reads a tensor that is not its parameter, buffer or input"
                + (f"\n  at {where}" if where else "")
                + "\nWhat to do: register it on the module (nn.Parameter, or register_buffer for a constant) "
                "or pass it as an input (an input that requires grad gets its gradient)."
            ) from exc
        raise Untraceable(
            f"could not trace {name}: {type(exc).__name__}: {_first_line(exc)}"
            + (f"\n  at {where}" if where else "")
            + "\nWhat to do: make forward() free of Python control flow on tensor values (use "
            "torch.where / torch.cond), of .item()/.tolist() and of non-tensor side effects, or plan "
            "the traceable sub-module on its own (an optimized sub-module passes gradients to the layers "
            "around it); recompute.optimize captures such a model with TorchDynamo instead. The torch error "
            "is chained below."
        ) from exc


def _bytes(val: Any) -> int:
    """Bytes of the tensors an fx node produces (its ``meta['val']``)."""
    return tensor_bytes(t for _, t in output_tensors(val))


def _label(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    op = str(node.target).removeprefix("aten.")
    return f"{path}:{op}" if path else op


def trace(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor] | torch.Tensor,
    *,
    cost_model: str = "paper",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    split_convolutions: bool | Collection[str] = False,
    workspaces: bool = True,
    **cost_options: Any,
) -> Graph:
    """Trace the training step of ``model`` at ``example_inputs`` into a :class:`Graph`.

    ``cost_model`` is one of :data:`recompute.capture.costs.COST_MODELS` (``"paper"``: 10 per convolution and 1
    otherwise, as in Kusumoto §3; ``"flops"``; ``"measured"``). With ``loss_fn`` the step is
    ``loss_fn(model(*inputs))`` and its ops are part of V (what :func:`recompute.measure` runs);
    without, the step ends at the model's outputs and their gradients come from the caller's loss
    (what :func:`recompute.optimize` runs). Inputs may be FakeTensors, so a paper-scale graph costs no
    activation memory. The graph keeps the executable program in ``graph.program``.
    ``split_convolutions`` runs each convolution's backward as two ops, the weight's gradient and then
    the input's from the output's gradient alone (:func:`recompute.capture.convsplit.split_convolution_backwards`),
    so that a schedule can free the input, or recompute it later, in between: the same values on the
    CPU (within float32 rounding on a few shapes), slower than the fused op on large maps. A
    collection of ``convolution_backward`` node names splits only those
    (:func:`recompute.rewrites.peak.needed_splits`: the ones a schedule's peak needs). ``workspaces``:
    measure what each op allocates and frees inside itself (:mod:`recompute.capture.workspace`), which the
    simulator then counts, where the step's tensors are real (a CUDA device's, the CPU's; not
    FakeTensors on the CPU); ``False``: tensor storages only, what the ``fake`` backend meters.
    """
    check_model(model)
    check_inputs(example_inputs)
    check_cost_model(cost_model, cost_options)
    check_flag("workspaces", workspaces)
    if isinstance(split_convolutions, (str, bytes)) or not isinstance(split_convolutions, (bool, Collection)):
        raise TypeError(f"split_convolutions must be True, False or a collection of convolution_backward node names, "
                        f"got {split_convolutions!r}")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    twice = _modules_registered_twice(model)
    if twice:
        raise TraceError(
            f"{type(model).__name__} registers one module under several names ({', '.join(twice[:3])}"
            f"{', …' if len(twice) > 3 else ''}); tracing the training step does not support that. What to "
            "do: register it once and call it several times (a parameter shared between two modules, as "
            "tied input and output embeddings are, is fine)."
        )
    lost = _rnn_dropout(model)
    if lost:
        raise TraceError(
            f"{type(model).__name__} has recurrent layers with dropout between layers ({', '.join(lost)}) in training "
            "mode; PyTorch's traced RNN (torch._decomp.decompositions._rnn_helper) leaves that dropout out, so "
            "the planned step would train without it. What to do: use single-layer RNNs with nn.Dropout "
            "between them, or dropout=0."
        )
    hooks = _python_hooks(model)
    if hooks:
        warnings.warn(
            f"{type(model).__name__} has Python hooks: {'; '.join(hooks[:4])}{'; …' if len(hooks) > 4 else ''}. "
            "Tracing runs them; what they return (a changed output or gradient) is part of every planned "
            "step, but the step does not call them again: a hook that records, prints or counts sees the "
            "tracing only. What to do: register such a hook on a module outside the planned one (an "
            "optimized sub-module passes its outputs and gradients to the layers around it).",
            HookWarning, stacklevel=2)
    cumulative = _cumulative_batch_norm(model)
    if cumulative:
        raise TraceError(
            f"{type(model).__name__} has BatchNorm layers in training mode with momentum=None ({', '.join(cumulative[:3])}"
            f"{', …' if len(cumulative) > 3 else ''}): their cumulative average weighs each step by "
            "1 / num_batches_tracked, read as a Python number every step, which a traced step cannot do. "
            "What to do: give them a momentum (PyTorch's default is 0.1), or plan the model in eval()."
        )
    start = _time.perf_counter()
    # tracing runs the step (dropout included): on a fork of the generators, so that the caller's
    # next real step draws the masks plain training would
    cuda = sorted({t.device.index or 0 for t in (*args, *model.parameters(), *model.buffers()) if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        joint = _export(model, args, loss_fn)
    if split_convolutions:
        _split_convolutions(joint, None if split_convolutions is True else set(split_convolutions))
    # the CPU's workspaces are measured by running the ops: not at a FakeTensor trace's paper scale
    fake = any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in (*args, *model.parameters()))
    on = (() if not workspaces else ("cuda",) if fake else ("cuda", "cpu"))
    g = graph_of(joint, loss=loss_fn is not None, cost_model=cost_model, workspaces=on, **cost_options)
    g.program.trace_seconds = _time.perf_counter() - start
    return g


def _split_convolutions(joint: JointProgram, only: set[str] | None) -> None:
    """Every convolution backward of ``joint`` (named in ``only``, where given) that returns the
    input's and the weight's gradient as two ops (:func:`~recompute.capture.convsplit.split_convolution_backwards`);
    the input's joins the backward where the fused op's element was, under the same owner, and is the
    step's gradient of an input where that element was. ``ValueError`` for a name in ``only`` that is
    no convolution backward of ``joint``."""
    before, backward = set(joint.gm.graph.nodes), set(joint.backward)
    convolutions = [n for n in joint.backward if n.target is torch.ops.aten.convolution_backward.default]
    if only is not None:
        check_split_names(only, [n.name for n in convolutions])
    element = {n.name: u.name for n in convolutions for u in n.users if u.target is operator.getitem and u.args[1] == 0}
    split_convolution_backwards(joint.gm, where_input_dies=False, only=only)
    joint.backward = [n for n in joint.gm.graph.nodes if n in backward or n not in before]
    made = {element[n.meta[SPLIT_FROM]]: n.name for n in joint.backward if SPLIT_FROM in n.meta}
    joint.input_grads = {made.get(name, name): x for name, x in joint.input_grads.items()}
    joint.__post_init__()


def graph_of(joint: JointProgram, *, loss: bool = False, cost_model: str = "paper",
             workspaces: Collection[str] = ("cuda", "cpu"), **cost_options: Any) -> Graph:
    """G = (V, E) with costs of a joint graph: its forward half condensed into V (see the module
    docstring). :func:`trace` builds it from ``aot_export_module``'s joint graph; the
    ``torch.compile`` backend (:mod:`recompute.doors.backend`) from the one AOTAutograd partitions.
    ``workspaces``: the device types on which to measure what each op allocates inside itself
    (:mod:`recompute.capture.workspace`), as the ops run one by one (eager, our executor); inductor's compiled
    modules do not pay those (docs/gpu.md)."""
    program = _condense(joint, loss=loss)
    program.workspace = step_workspace(joint.gm, workspaces)
    preds, mem, names, ops = _graph_lists(program)
    outputs = tuple(sorted({program.group[n.name] for n in program.user_outputs if n.name in program.group}))
    time = costs.cost(cost_model, program, **cost_options)
    return Graph(
        preds=preds, mem=mem, time=time, names=names, ops=ops, outputs=outputs,
        cost_model=cost_model, program=program, saved=_saved_bytes(program),
    )


def _rnn_dropout(model: torch.nn.Module) -> list[str]:
    """Multi-layer RNNs whose inter-layer dropout a trace would drop: ``name (dropout=p)``."""
    return [f"{name or 'model'} (dropout={m.dropout})" for name, m in model.named_modules()
            if isinstance(m, torch.nn.RNNBase) and m.training and m.dropout > 0 and m.num_layers > 1]


def _cumulative_batch_norm(model: torch.nn.Module) -> list[str]:
    """BatchNorm layers that update a cumulative average in this step (``momentum=None``)."""
    return [name or "the model" for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.training and m.momentum is None
            and m.track_running_stats]


class HookWarning(UserWarning):
    """The traced model has Python hooks, which run while tracing and not at each step."""


_HOOK_KINDS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
               "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}


def _python_hooks(model: torch.nn.Module) -> list[str]:
    """The module hooks a trace runs once (``kind `hook` on `module` (Class)``), the global ones
    included; not torch's ``weight_norm`` and ``spectral_norm``, whose pre-hooks only compute the
    weight (and its power iteration's buffers), which the traced step computes as they do."""
    def named(hook: Any) -> str:
        return getattr(hook, "__qualname__", type(hook).__name__)

    found = [f"global {kind} `{named(h)}`" for attr, kind in _HOOK_KINDS.items()
             for h in getattr(torch.nn.modules.module, f"_global{attr}").values()]
    for name, m in model.named_modules():
        found += [f"{kind} `{named(h)}` on `{name or 'the model'}` ({type(m).__name__})"
                  for attr, kind in _HOOK_KINDS.items() for h in getattr(m, attr).values()
                  if not isinstance(h, (WeightNorm, SpectralNorm))]
    return found


def _modules_registered_twice(model: torch.nn.Module) -> list[str]:
    """Names under which an already registered module with parameters or buffers is registered again
    (``nn.Sequential(layer, act, layer)``): AOTAutograd's export fails on them."""
    seen: set[int] = set()
    twice = []
    for name, m in model.named_modules(remove_duplicate=False):
        holds = next(m.parameters(recurse=False), None) is not None or next(m.buffers(recurse=False), None) is not None
        if id(m) in seen and holds:
            twice.append(name)
        seen.add(id(m))
    return twice


def _condense(joint: JointProgram, loss: bool) -> Program:
    group: dict[str, int] = {}
    members: list[list[fx.Node]] = []
    prologue: list[fx.Node] = []
    live = set(joint.user_inputs)  # fx nodes that depend on a user input
    for node in joint.forward:
        inputs = [a.name for a in node.all_input_nodes]
        # a random op stays in V even where it reads no input (inductor's dropout draws into an
        # ``empty`` tensor): run up front, it would draw before the random ops traced ahead of it
        if not any(a in live for a in inputs) and not is_random(node):
            prologue.append(node)
            continue
        live.add(node.name)
        base = node.args[0] if node.args else None
        if (node.target is operator.getitem or _is_view(node.target)) and isinstance(base, fx.Node):
            if base.name in group:  # an alias of its base's storage: same node of V
                group[node.name] = group[base.name]
                members[group[node.name]].append(node)
            else:  # an alias of an input (inputs are not in V): computed up front, costs nothing
                prologue.append(node)
            continue
        group[node.name] = len(members)
        members.append([node])
    owner: dict[str, int] = {}
    last: int | None = None
    for node in joint.backward:
        last = group.get(joint.owner.get(node.name, ""), last)
        if last is not None:
            owner[node.name] = last
    return Program(joint=joint, group=group, members=members, prologue=prologue, owner=owner, loss=loss)


def _graph_lists(p: Program) -> tuple[tuple[tuple[int, ...], ...], np.ndarray, tuple[str, ...], tuple[str, ...]]:
    preds, mem, names, ops = [], [], [], []
    for v, nodes in enumerate(p.members):
        ps = {p.group[a.name] for n in nodes for a in n.all_input_nodes if a.name in p.group} - {v}
        preds.append(tuple(sorted(ps)))
        op = nodes[0]
        mem.append(_bytes(op.meta.get("val")))
        names.append(_label(op))
        ops.append(str(op.target))
    return tuple(preds), np.asarray(mem, dtype=np.int64), tuple(names), tuple(ops)


def _saved_bytes(p: Program) -> np.ndarray:
    """Bytes of each node's output that the backward pass reads (its own backward or a successor's):
    what a value costs while its block waits for backward; a value nobody reads there (a convolution
    output read only by a ReLU, which saves its own output) lives only briefly."""
    saved = np.zeros(len(p.members), dtype=np.int64)
    read = {a.name for b in p.joint.backward for a in b.all_input_nodes}
    for v, nodes in enumerate(p.members):
        op = nodes[0]
        outs = output_tensors(op.meta.get("val"))
        used = set()
        for n in nodes:
            if n.name in read:
                used.add(n.args[1] if n.target is operator.getitem else None)
        saved[v] = tensor_bytes(t for i, t in outs if i in used or (None in used and i is None))
    return saved
