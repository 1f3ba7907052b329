"""``recompute.trace``: extract G = (V, E) with costs from an ``nn.Module``.

The model is exported with ``torch.export`` and functionalised (``run_decompositions({})``): an
ATen-level graph where in-place ops became functional (``relu_`` → ``relu``), BatchNorm returns its
new running statistics instead of writing them, and every shape is known from FakeTensor propagation,
so tracing at paper scale allocates no activation. The fx graph is then condensed into the paper's V:

* one node per tensor-producing operation that depends on the user inputs;
* ``getitem`` of a multi-output op and view ops (``view``, ``t``, ``expand``…) belong to the node whose
  storage they alias, so they neither create bogus nodes nor hide a dependency;
* computations on parameters and buffers alone (BatchNorm's ``num_batches_tracked + 1``, weight
  transposes) and views of the inputs are not in V: the executor runs them once per step, before the
  forward pass.
"""

from __future__ import annotations

import operator
import re
import time as _time
import traceback
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from . import costs
from .fxnodes import output_tensors, run_node
from .graph import Graph
from .validate import check_cost_model, check_inputs, check_model

__all__ = ["trace", "TraceError", "Program"]


class TraceError(RuntimeError):
    """The model could not be traced; the message names the op or line and what to do."""


@dataclass(eq=False)
class Program:
    """The executable side of a traced :class:`Graph`.

    Attributes:
        gm: the functional ATen graph (an ``fx.GraphModule``).
        params, buffers: placeholder name → fully qualified name in the model.
        user_inputs: placeholder names of the model's tensor inputs, in call order.
        buffer_writes: output fx node → buffer FQN it must be written to (BatchNorm statistics).
        user_outputs: the fx nodes whose values the model returns.
        group: fx node name → the id of its node in V, for every fx node in V (views and getitems
            included); placeholders and parameter-only (prologue) nodes are absent.
        members: for each node of V, its fx nodes in execution order (the op first).
        prologue: fx nodes outside V, run once per step before the forward pass: computations on
            parameters and buffers alone, and views of the inputs.
        out_spec: pytree spec to rebuild the model's output structure.
    """

    gm: fx.GraphModule
    params: dict[str, str]
    buffers: dict[str, str]
    user_inputs: list[str]
    buffer_writes: dict[str, str]
    user_outputs: list[fx.Node]
    group: dict[str, int]
    members: list[list[fx.Node]]
    prologue: list[fx.Node]
    out_spec: Any = None
    module: torch.nn.Module | None = None
    trace_seconds: float = 0.0


def _is_view(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def _user_frame(exc: BaseException) -> str | None:
    """The innermost ``File ..., line N`` of the exception that is not inside torch: the user's line."""
    text = "".join(traceback.format_exception(exc))
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', text)
    user = [f for f in frames if "/torch/" not in f[0] and not f[0].startswith("<")]
    if not user:
        return None
    path, line, func, code = user[-1]
    return f'{path}:{line} in {func}: "{code.strip()}"'


def _export(model: torch.nn.Module, args: tuple) -> ExportedProgram:
    try:
        ep = torch.export.export(model, args, strict=False)
        return ep.run_decompositions({})
    except Exception as exc:  # torch raises many different types here; all mean "not traceable"
        where = _user_frame(exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(
            f"could not trace {type(model).__name__} with torch.export: {type(exc).__name__}: {first}"
            + (f"\n  at {where}" if where else "")
            + "\nWhat to do: make forward() free of Python control flow on tensor values (use "
            "torch.where / torch.cond), of .item()/.tolist() and of non-tensor side effects, or plan "
            "the traceable sub-module on its own. The torch error is chained below."
        ) from exc


def _bytes(val: Any) -> int:
    """Bytes of the tensors an fx node produces (its ``meta['val']``)."""
    return sum(t.numel() * t.element_size() for _, t in output_tensors(val))


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
    **cost_options: Any,
) -> Graph:
    """Trace ``model`` at ``example_inputs`` into a :class:`Graph` with M_v (bytes) and T_v.

    ``cost_model`` is one of :data:`recompute.costs.COST_MODELS` (``"paper"``: 10 per convolution and 1
    otherwise, as in Kusumoto §3; ``"flops"``; ``"measured"``). Inputs may be FakeTensors, so a
    paper-scale graph costs no activation memory. The graph keeps the executable program in
    ``graph.program`` for :func:`recompute.execute`.
    """
    check_model(model)
    check_inputs(example_inputs)
    check_cost_model(cost_model)
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    start = _time.perf_counter()
    program = _condense(_export(model, args), model)
    preds, mem, names, ops = _graph_lists(program)
    saved = _saved_bytes(program)
    outputs = tuple(sorted({program.group[n.name] for n in program.user_outputs if n.name in program.group}))
    time = costs.cost(cost_model, program, **cost_options)
    program.trace_seconds = _time.perf_counter() - start
    return Graph(
        preds=preds, mem=mem, time=time, names=names, ops=ops, outputs=outputs,
        cost_model=cost_model, program=program, saved=saved,
    )


def _condense(ep: ExportedProgram, model: torch.nn.Module) -> Program:
    gm = ep.graph_module
    sig = ep.graph_signature
    params, buffers, user_inputs = {}, {}, []
    for spec in sig.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.PARAMETER:
            params[name] = spec.target
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            buffers[name] = spec.target
        elif spec.kind == InputKind.USER_INPUT:
            user_inputs.append(name)
        else:
            raise TraceError(f"unsupported model input {name!r} of kind {spec.kind}")
    buffer_writes: dict[str, str] = {}
    user_output_names: list[str] = []
    for spec in sig.output_specs:
        if spec.kind == OutputKind.BUFFER_MUTATION:
            buffer_writes[spec.arg.name] = spec.target
        elif spec.kind == OutputKind.USER_OUTPUT:
            user_output_names.append(spec.arg.name)
        else:
            raise TraceError(f"unsupported model output {spec.arg.name!r} of kind {spec.kind}")

    group: dict[str, int] = {}
    members: list[list[fx.Node]] = []
    prologue: list[fx.Node] = []
    live = set(user_inputs)  # fx nodes that depend on a user input
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        inputs = [a.name for a in node.all_input_nodes]
        if not any(a in live for a in inputs):
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
    by_name = {n.name: n for n in gm.graph.nodes}
    return Program(
        gm=gm,
        params=params,
        buffers=buffers,
        user_inputs=user_inputs,
        buffer_writes=buffer_writes,
        user_outputs=[by_name[n] for n in user_output_names],
        group=group,
        members=members,
        prologue=prologue,
        out_spec=ep.call_spec.out_spec,
        module=model,
    )


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
    """Bytes of each node's output that plain autograd keeps for backward (saved by the node itself or
    by a successor), found by running the forward pass once on FakeTensors under a saved-tensor hook.

    This is what a value costs while its block waits for backward; a value nobody saves (a
    convolution output read only by a ReLU, which saves its own output) lives only briefly.
    """
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    owner: dict[int, tuple[int, int]] = {}  # storage → (node of V, bytes)
    saved = np.zeros(len(p.members), dtype=np.int64)
    counted: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key in owner and key not in counted:
            counted.add(key)
            v, nbytes = owner[key]
            saved[v] += nbytes
        return t

    env: dict[str, Any] = {}  # every value stays alive, so storage ids are never reused
    with mode:
        for node in p.gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta["val"]
                env[node.name] = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype).requires_grad_(
                    node.name in p.params and val.dtype.is_floating_point
                )
        for node in p.prologue:
            env[node.name] = run_node(node, env)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for node in p.gm.graph.nodes:
                if node.name not in p.group:
                    continue
                out = env[node.name] = run_node(node, env)
                v = p.group[node.name]
                if p.members[v][0] is not node:
                    continue  # a view or getitem: its storage is its base's
                for _, t in output_tensors(out):
                    owner.setdefault(t.untyped_storage()._cdata, (v, t.numel() * t.element_size()))
    return saved
