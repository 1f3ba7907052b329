"""The training step as one functional ATen graph: forward, loss, backward (the *joint graph*).

``trace_step(model, inputs, loss_fn)`` exports ``loss_fn(model(*inputs))`` (or ``model(*inputs)`` when
``loss_fn`` is None) with ``torch._functorch.aot_autograd.aot_export_module(trace_joint=True)``: the
forward ops, then the backward ops in the order the autograd engine ran them, with BatchNorm's new
running statistics and the parameter gradients as outputs. Inputs may be FakeTensors, so a
paper-scale step allocates nothing.

The gradients of the step's outputs come in as *tangent* placeholders: a custom ``autograd.Function``
(``_Seed``) takes the outputs and the tangents and hands the tangents back as their gradients, so the
joint graph is the vector-Jacobian product of the step, with no op for the seed itself. This is what
lets :mod:`recompute.doors.execute` run the backward half inside ``autograd.Function.backward`` with the
gradient the caller's own loss produced.

Every backward op is tagged with its *owner*: the forward op whose ``grad_fn`` the engine was running
when the op was traced (pre-hooks on every ``grad_fn`` record where each one's ops begin). Gradient
accumulation for a value with several users belongs to the ``grad_fn`` that produced the last
contribution, as in the engine.
"""

from __future__ import annotations

import contextlib
import operator
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_map

__all__ = ["JointProgram", "StepError", "trace_step", "rnn_for_training", "without_caches", "CacheDropped", "OwnCheckpoints"]


@dataclass(eq=False)
class JointProgram:
    """The joint graph of one training step and what each of its placeholders and outputs is.

    Attributes:
        gm: the functional ATen graph (``fx.GraphModule``) of forward and backward.
        params, buffers: placeholder name → fully qualified name in the model.
        user_inputs: placeholder names of the step's tensor inputs, in call order.
        tangents: placeholder names of the gradients of the step's outputs (one per output that
            requires grad, in their order).
        user_outputs: fx nodes the step returns (the model's outputs, or the loss).
        differentiable: per user output, whether it requires grad (an argmax or a detached tensor
            returned beside the logits does not, and gets no tangent).
        buffer_writes: fx node name → buffer FQN it must be written to (BatchNorm statistics).
        param_grads: fx node name → FQN of the parameter whose gradient it is.
        input_grads: fx node name → placeholder name of the user input whose gradient it is (the
            inputs that required grad when traced).
        forward, backward: the call_function nodes of each half, in graph order.
        owner: backward node name → name of the forward op whose ``grad_fn`` ran it (absent where
            the engine ran it outside any ``grad_fn``).
        out_spec: pytree spec of the model's output.
    """

    gm: fx.GraphModule
    params: dict[str, str]
    buffers: dict[str, str]
    user_inputs: list[str]
    tangents: list[str]
    user_outputs: list[fx.Node]
    buffer_writes: dict[str, str]
    param_grads: dict[str, str]
    forward: list[fx.Node]
    backward: list[fx.Node]
    owner: dict[str, str]
    out_spec: Any = None
    module: torch.nn.Module | None = field(default=None, repr=False)
    input_grads: dict[str, str] = field(default_factory=dict)
    differentiable: tuple[bool, ...] | None = None  # None: every output

    def node(self, name: str) -> fx.Node:
        return self._by_name[name]

    @property
    def gradients(self) -> list[str]:
        """Every gradient the step returns (parameters', then inputs'): held to the step's end."""
        return [*self.param_grads, *self.input_grads]

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.gm.graph.nodes}


class _Seed(torch.autograd.Function):
    """``_Seed.apply(n, *outputs, *tangents)`` → a scalar zero whose backward gives each output its
    tangent: the joint graph then receives the outputs' gradients as inputs."""

    @staticmethod
    def forward(n: int, *tensors: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return tensors[0].new_zeros(())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        n = inputs[0]
        ctx.n = n
        ctx.save_for_backward(*inputs[1 + n:])

    @staticmethod
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple:  # type: ignore[override]
        return (None, *ctx.saved_tensors, *[None] * ctx.n)


class _Step(torch.nn.Module):
    """``forward(*inputs, *tangents)`` → (seed, *outputs): the module ``aot_export_module`` traces; a
    tangent for each output that requires grad (``differentiable``)."""

    def __init__(self, model: torch.nn.Module, n_inputs: int, loss_fn: Callable[[Any], torch.Tensor] | None,
                 differentiable: Sequence[bool]):
        super().__init__()
        self.model, self.n_inputs, self.loss_fn = model, n_inputs, loss_fn
        self.differentiable = list(differentiable)
        self.out_spec: Any = None
        # ((sequence number, name) of a grad_fn, the last traced node before it runs): no reference to
        # the grad_fn itself, whose hook would then hold it in a cycle through C++ that gc never frees
        self.marks: list[tuple[tuple[int, str], str]] = []
        self.hooks: list[Any] = []
        self.listing_once = False

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator:
        """While ``listing_once``: each tensor once, under its first name, whatever the caller asks
        (AOTAutograd's export would list every name of a tied parameter as an input: :func:`_tied_once`)."""
        return super().named_parameters(prefix, recurse, remove_duplicate or self.listing_once)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator:
        return super().named_buffers(prefix, recurse, remove_duplicate or self.listing_once)

    def forward(self, *args: torch.Tensor) -> tuple:
        self._distinct_gradients([*self.model.parameters(), *args[: self.n_inputs]])
        out = without_caches(self.model(*args[: self.n_inputs]))
        if self.loss_fn is not None:
            out = self.loss_fn(out)
        flat, self.out_spec = tree_flatten(out)
        self._mark(flat)
        seeded = [t for t, d in zip(flat, self.differentiable) if d]
        seed = _Seed.apply(len(seeded), *seeded, *args[self.n_inputs:])
        return (seed, *(t.detach() for t in flat))

    def _distinct_gradients(self, leaves: Sequence[torch.Tensor]) -> None:
        """Give each leaf's gradient a node of its own: where two leaves get the very same tensor
        (an LSTM's two biases, ``a + b``), AOTAutograd's signature would map two gradients to one
        graph output and fail; a view of the shared tensor is what accumulation in eager keeps too."""
        seen: list[torch.Tensor] = []  # held, so that no identity is reused while tracing

        def distinct(grad: torch.Tensor) -> torch.Tensor | None:
            # functionalization wraps the one traced tensor in a new wrapper per use
            inner = torch._from_functional_tensor(grad.elem) if isinstance(grad, FunctionalTensor) else grad
            if any(inner is g for g in seen):
                return grad.view_as(grad)
            seen.append(inner)
            return None

        self.hooks = [t.register_hook(distinct) for t in leaves if t.requires_grad]

    def _mark(self, outs: Sequence[torch.Tensor]) -> None:
        """Pre-hook every ``grad_fn`` to record the last traced node before it runs."""
        seen: set = set()
        marks = self.marks  # not ``self``: what a grad_fn's hook refers to lives as long as the graph
        stack = [t.grad_fn for t in outs if t.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)

            def pre(_grads: Any, key: tuple[int, str] = (fn._sequence_nr(), fn.name())) -> None:
                mode = get_proxy_mode()
                if mode is not None:  # iter(): in torch 2.11 reversed() gives a view, not an iterator
                    marks.append((key, next(iter(reversed(mode.tracer.graph.nodes))).name))

            fn.register_prehook(pre)
            stack.extend(f for f, _ in fn.next_functions if f is not None)


def _normal(name: str) -> str:
    return name.lower().replace("_", "")


def _grad_fn_op(name: str) -> str:
    """``NativeBatchNormLegitBackward0`` → ``nativebatchnormlegit``."""
    return _normal(re.sub(r"Backward\d*$", "", name))


def _op_name(node: fx.Node) -> str:
    target = node.target
    name = target._opname if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))
    return _normal(name)


def _matches(fn_op: str, node_op: str) -> bool:
    return node_op in (fn_op, fn_op + "functional")


def trace_step(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> JointProgram:
    """Export the training step of ``model`` at ``inputs`` as a :class:`JointProgram`."""
    # imported here: AOTAutograd brings TorchDynamo (~2.5 s), which `import recompute` (and a CLI run
    # that stops at a config mistake) should not pay
    from torch._functorch.aot_autograd import aot_export_module

    # an input that requires grad gets its gradient in the joint graph; detached, since a non-leaf
    # input's history belongs to the caller's graph, not to the step
    inputs = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
    # torch.compiler.is_compiling() is true while tracing, as under torch.compile and torch.export: a
    # model that checks it takes its traceable path (Hugging Face's masks skip a data-dependent check
    # for packed sequences, `if not is_tracing(mask) and (mask[:, -1] == 0).all()`)
    with (_real_parameters_allowed(detect_fake_mode(inputs)), _eager_kernels(), torch.compiler._compile_session_context(),
          rnn_for_training()):
        with _own_checkpoints() as regions:
            tangents, differentiable, unused = _probe(model, inputs, loss_fn)
        if regions:
            warnings.warn(
                f"{type(model).__name__} checkpoints {len(regions)} region(s) itself (torch.utils.checkpoint"
                f"{', e.g. a Hugging Face model after gradient_checkpointing_enable()' if len(regions) > 1 else ''}): "
                "the planned step decides what is recomputed and runs the model's ops as their forward does, "
                "so a BatchNorm in such a region updates its statistics once per step, where eager's recomputation "
                "updates them a second time (as torch.compile's steps do). What to do: nothing, or turn the "
                "model's own checkpointing off to plan it alone", OwnCheckpoints, stacklevel=3)
        step = _Step(model, len(inputs), loss_fn, differentiable)
        with _frozen(unused), _saved_in_python(), _tied_once(step):
            try:
                gm, sig = aot_export_module(step, (*inputs, *tangents), trace_joint=True, output_loss_index=0)
            finally:
                for hook in step.hooks:
                    hook.remove()
    by_name = {n.name: n for n in gm.graph.nodes}
    seed = by_name[sig.user_outputs[0]]
    user_outputs, detached = [], set()
    for name in sig.user_outputs[1:]:
        node = by_name[name]
        # the step returns detached aliases of the real outputs, read by nothing else
        while node.target in _ALIASES and all(u.op == "output" for u in node.users):
            detached.add(node)
            node = node.args[0]
        user_outputs.append(node)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n not in detached]
    cut = nodes.index(seed)
    forward, backward = nodes[:cut], nodes[cut + 1:]
    return JointProgram(
        gm=gm,
        params=_unwrap(sig.inputs_to_parameters),
        buffers=_unwrap(sig.inputs_to_buffers),
        user_inputs=list(sig.user_inputs[: len(inputs)]),
        tangents=list(sig.user_inputs[len(inputs):]),
        user_outputs=user_outputs,
        buffer_writes=_unwrap(sig.buffers_to_mutate),
        param_grads=_unwrap(sig.backward_signature.gradients_to_parameters),
        input_grads=dict(sig.backward_signature.gradients_to_user_inputs),
        forward=forward,
        backward=backward,
        owner=_owners(step.marks, forward, nodes),
        out_spec=step.out_spec,
        module=model,
        differentiable=tuple(differentiable),
    )


@contextlib.contextmanager
def rnn_for_training() -> Iterator[None]:
    """While tracing a training step: torch's LSTM decomposition traced the way it is differentiated.
    It picks oneDNN's inference layer (``mkldnn_rnn_layer``, ``train=False``) wherever the input takes
    no gradient — the usual case, the input is data — as if nothing needed the layer's backward; but the
    parameters' gradients do, and that layer's kernel keeps the workspace its backward reads only with
    grad mode on, which the step's forward module (inside an autograd Function) runs without ("Expected
    a proper Tensor but got None ... 'workspace'"). Where a parameter requires grad, the generic layer
    (its gates as ATen ops) is traced, as it is for an input that requires grad."""
    from torch._decomp import decompositions

    select = decompositions.select_one_layer_lstm_function

    def for_training(input: torch.Tensor, hx: Any, params: Any) -> Callable[..., Any]:
        if any(t.requires_grad for layer in params for t in layer):
            return decompositions.one_layer_lstm
        return select(input, hx, params)

    decompositions.select_one_layer_lstm_function = for_training
    try:
        yield
    finally:
        decompositions.select_one_layer_lstm_function = select


@contextlib.contextmanager
def _tied_once(step: _Step) -> Iterator[None]:
    """While exporting ``step``: a tied parameter (one tensor under several names, as BERT's output bias
    is its decoder's) is one input of the step, reparametrized under all its names. AOTAutograd lists
    every name as an input of its own and reparametrizes each name with its own input, so that a name
    the forward never reads (BERT's ``cls.predictions.bias``, read as ``decoder.bias``) gets no
    gradient and the export fails ("Found a parameter that did not receive a gradient"). The step lists
    each tensor once (``listing_once``); the reparametrization ties the other names to it
    (``tie_weights``, which finds them in the full listing), and its gradient is the sum of every use,
    as in eager."""
    from torch.nn.utils import stateless

    plain = stateless._reparametrize_module

    @contextlib.contextmanager
    def tied(module: torch.nn.Module, values: dict[str, Any], tie_weights: bool = False, **kwargs: Any) -> Iterator[None]:
        step.listing_once = False
        try:
            with plain(module, values, tie_weights=True, **kwargs):
                step.listing_once = True
                yield
        finally:
            step.listing_once = True

    stateless._reparametrize_module, step.listing_once = tied, True
    try:
        yield
    finally:
        stateless._reparametrize_module, step.listing_once = plain, False


@contextlib.contextmanager
def _real_parameters_allowed(mode: FakeTensorMode | None) -> Iterator[None]:
    """FakeTensor inputs with the model's real parameters: let the inputs' mode take both."""
    if mode is None:
        yield
        return
    saved, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True
    try:
        yield
    finally:
        mode.allow_non_fake_inputs = saved


@contextlib.contextmanager
def _saved_in_python() -> Iterator[None]:
    """Keep the tensors autograd saves while tracing in a list of ours, emptied afterwards.

    A traced op that saves its own output (ReLU for its backward) makes a cycle output → grad_fn →
    saved output inside C++, which gc cannot see: the traced graph, and through its leaves the
    model's parameters, stayed alive after every trace (a paper network's parameters per trace).
    """
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> int:
        saved.append(t)
        return len(saved) - 1

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, saved.__getitem__):
            yield
    finally:
        saved.clear()


def _fused_composites() -> list[torch._ops.OpOverload]:
    """The ATen ops with both a fused CPU/CUDA kernel and a ``CompositeImplicitAutograd`` decomposition
    (``silu_backward``, ``mish_backward``, ``_fused_rms_norm``, ``native_channel_shuffle`` in torch 2.14):
    eager runs the kernel, while the export's functionalization decomposes every composite op."""
    keys = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)
    found = []
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualified.partition("::")
        if namespace != "aten" or not torch._C._dispatch_has_kernel_for_dispatch_key(
                qualified, torch._C.DispatchKey.CompositeImplicitAutograd):
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, k) for k in keys):
            name, _, overload = name.partition(".")
            found.append(getattr(getattr(torch.ops.aten, name), overload or "default"))
    return found


def _backend_kernel(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether eager would run ``op``'s own kernel on these arguments' device (not its decomposition)."""
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor):
            key = torch._C._parse_dispatch_key(torch._C._dispatch_key_for_device(x.device.type))
            return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
    return False


@contextlib.contextmanager
def _eager_kernels() -> Iterator[None]:
    """Trace the kernels eager runs, so that the step is bitwise the one plain training runs.

    - While tracing, torch swaps the C++ kernels of ``upsample_*`` for Python decompositions into
      index arithmetic that rounds differently from the kernel eager calls; lifting those Python
      kernels keeps ``aten.upsample_bilinear2d`` (and its backward) in the graph.
    - The export decomposes composite ops that eager runs fused (:func:`_fused_composites`, e.g.
      SiLU's backward into sigmoid arithmetic); a Python ``CompositeImplicitAutograd`` kernel that
      declines (``NotImplemented``) where the device has the fused kernel keeps the op itself.
    """
    lifted = []
    for name in dir(torch.ops.aten):
        if not name.lstrip("_").startswith("upsample"):
            continue
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            for key in (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd):
                if key in op.py_kernels:
                    lifted.append((op, key, op.py_kernels.pop(key)))
            op._dispatch_cache.clear()
    added = []
    for op in _FUSED_COMPOSITES:
        if torch._C.DispatchKey.CompositeImplicitAutograd in op.py_kernels:
            continue

        def keep(*args: Any, op: torch._ops.OpOverload = op, **kwargs: Any) -> Any:
            if _backend_kernel(op, args, kwargs):
                return NotImplemented
            return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)

        op.py_kernels[torch._C.DispatchKey.CompositeImplicitAutograd] = keep
        op._dispatch_cache.clear()
        added.append(op)
    try:
        yield
    finally:
        for op, key, kernel in lifted:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()
        for op in added:
            op.py_kernels.pop(torch._C.DispatchKey.CompositeImplicitAutograd, None)
            op._dispatch_cache.clear()


_FUSED_COMPOSITES = _fused_composites()



class StepError(ValueError):
    """The step cannot be planned for a reason of the model's, not of tracing (the message says what)."""


class OwnCheckpoints(UserWarning):
    """A traced model calls ``torch.utils.checkpoint`` itself."""


@contextlib.contextmanager
def _own_checkpoints() -> Iterator[list[str]]:
    """The regions the model checkpoints itself while the context lasts (``torch.utils.checkpoint``:
    the non-reentrant variant enters its saved-tensor hooks, the reentrant one applies its function)."""
    from torch.utils import checkpoint

    regions: list[str] = []
    enter, apply = checkpoint._checkpoint_hook.__enter__, checkpoint.CheckpointFunction.apply

    def entered(hooks: Any) -> Any:
        regions.append("non-reentrant")
        return enter(hooks)

    def applied(*args: Any, **kwargs: Any) -> Any:
        regions.append("reentrant")
        return apply(*args, **kwargs)

    checkpoint._checkpoint_hook.__enter__, checkpoint.CheckpointFunction.apply = entered, applied
    try:
        yield regions
    finally:
        checkpoint._checkpoint_hook.__enter__, checkpoint.CheckpointFunction.apply = enter, apply


class CacheDropped(UserWarning):
    """A model returned a key-value cache in training; the planned step returns None in its place."""


def without_caches(out: Any, warn: bool = False) -> Any:
    """``out`` with every Hugging Face key-value cache (``transformers.cache_utils.Cache``: what a
    decoder returns in training unless told ``use_cache=False``) replaced by None, as Hugging Face's
    own gradient checkpointing drops it: a planned step returns tensors, and no training step reads
    the cache. ``warn``: say so (:class:`CacheDropped`)."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return out
    dropped = []

    def drop(leaf: Any) -> Any:
        if isinstance(leaf, cache_utils.Cache):
            dropped.append(type(leaf).__name__)
            return None
        return leaf

    out = tree_map(drop, out)
    if dropped and warn:
        warnings.warn(f"the model returned a key-value cache ({', '.join(sorted(set(dropped)))}) in training: the "
                      "planned step returns None in its place, as Hugging Face's gradient checkpointing does (call it "
                      "with use_cache=False to say so)", CacheDropped, stacklevel=2)
    return out


def _check_outputs(model: torch.nn.Module, out: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The step's output tensors; a clear :class:`StepError` where one is no tensor (an int, None) or
    where nothing requires grad at all (no trainable parameter or input, or no output that has a
    gradient). An output that does not require grad (an argmax beside the logits) is returned as
    computed and gets no gradient."""
    name = type(model).__name__
    if not any(p.requires_grad for p in model.parameters()) and not any(x.requires_grad for x in inputs):
        raise StepError(f"nothing in the step of {name} requires grad (no trainable parameter, no input with "
                        "requires_grad), so there is no backward pass to plan. What to do: train a model with "
                        "parameters, or pass inputs with requires_grad=True.")
    leaves, _ = tree_flatten_with_path(out)
    if not leaves:
        raise StepError(f"{name}.forward returned {out!r}: no tensor to train on. What to do: return the "
                        "output tensor(s) the loss is computed from.")
    for path, leaf in leaves:
        where = f"output{keystr(path)}"
        if not isinstance(leaf, torch.Tensor):
            what = "None" if leaf is None else f"{type(leaf).__name__} {leaf!r}"
            raise StepError(f"{name}.forward returned {what} as {where}: a planned step "
                            "returns tensors only. What to do: return the tensors alone and compute other values "
                            "outside the optimized module (or optimize the sub-module that returns tensors).")
    if not any(leaf.requires_grad for _, leaf in leaves):
        raise StepError(f"no output of {name} requires grad (argmaxes, detached or integer tensors): there "
                        "is no backward pass to plan. What to do: return the output the loss is computed from.")
    return [leaf for _, leaf in leaves]


def _probe(model: torch.nn.Module, inputs: Sequence[torch.Tensor], loss_fn: Callable[[Any], torch.Tensor] | None
           ) -> tuple[list[torch.Tensor], list[bool], list[torch.nn.Parameter]]:
    """One step on FakeTensors (no arithmetic): a tangent like each output of the step that requires
    grad, made in the inputs' own kind (fake for fake inputs, real and uninitialised otherwise), which
    outputs require grad, and the trainable parameters that get no gradient (unused ones: the export
    needs them frozen)."""
    mode = detect_fake_mode(inputs)
    probe = mode if mode is not None else FakeTensorMode(allow_non_fake_inputs=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # on fake copies of the buffers: a training-mode forward updates BatchNorm's statistics
    buffers = {name: probe.from_tensor(b) for name, b in model.named_buffers(remove_duplicate=False)}
    with probe:
        xs = [x if mode is not None else probe.from_tensor(x) for x in inputs]
        out = without_caches(torch.func.functional_call(model, buffers, tuple(xs), strict=False), warn=True)
        flat = _check_outputs(model, out if loss_fn is None else loss_fn(out), inputs)
        differentiable = [t.requires_grad for t in flat]
        specs = [(t.shape, t.dtype, t.device) for t in flat if t.requires_grad]
    reached = _leaves_reached([t for t in flat if t.requires_grad])
    unused = [p for p in trainable if id(p) not in reached]
    with mode if mode is not None else contextlib.nullcontext():
        tangents = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in specs]
    return tangents, differentiable, unused


def _leaves_reached(outputs: Sequence[torch.Tensor]) -> set[int]:
    """The ids of the leaf tensors whose gradients a backward from ``outputs`` accumulates: the
    parameters ``torch.autograd.grad(..., allow_unused=True)`` would not answer None for, found by
    walking the autograd graph instead of running its backward (two thirds of the probe on DenseNet-161)."""
    reached = {id(t) for t in outputs if t.grad_fn is None}
    stack, seen = [t.grad_fn for t in outputs if t.grad_fn is not None], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):  # AccumulateGrad: the leaf itself
            reached.add(id(fn.variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return reached


@contextlib.contextmanager
def _frozen(params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _unwrap(names: dict[str, str]) -> dict[str, str]:
    """FQNs of ``_Step`` → FQNs of the user's model (drop the ``model.`` prefix)."""
    return {k: v.removeprefix("model.") for k, v in names.items()}


_ALIASES = (torch.ops.aten.alias.default, torch.ops.aten.detach.default)


def _owners(marks: list, forward: list[fx.Node], nodes: list[fx.Node]) -> dict[str, str]:
    """Backward node → the forward op whose ``grad_fn`` ran it.

    ``grad_fn``s are created in forward order, so sorting them by sequence number and walking the
    forward ops in graph order aligns each with its op by name (``ReluBackward0`` ↔ ``aten.relu``).
    A ``grad_fn`` starts right after the node recorded by its pre-hook; several may start at the same
    place (those that run no op), and the last of them owns what follows. Ops of a ``grad_fn`` that
    has no op of its own in V (a leaf's accumulation) keep the owner before them.
    """
    fns = sorted({fn for fn, _ in marks})  # (sequence number, name)
    candidates = [n for n in forward if n.target is not operator.getitem]
    op_of: dict[Any, str] = {}
    pos = 0
    for fn in fns:
        want = _grad_fn_op(fn[1])
        for j in range(pos, len(candidates)):
            if _matches(want, _op_name(candidates[j])):
                op_of[fn] = candidates[j].name
                pos = j + 1
                break
    index = {n.name: i for i, n in enumerate(nodes)}
    first_backward = min((i for i, n in enumerate(nodes) if n not in set(forward)), default=len(nodes))
    starts: dict[int, Any] = {}
    place = first_backward - 1
    for fn, last in marks:
        # an anchor dead-code-eliminated after tracing (the seed's unused ``ones_like``) stands at
        # the place of the anchor before it
        place = index.get(last, place)
        starts[place] = fn  # the last grad_fn to start at a place owns the ops after it
    owner: dict[str, str] = {}
    current: str | None = None
    for i in range(first_backward, len(nodes)):
        if i - 1 in starts and starts[i - 1] in op_of:
            current = op_of[starts[i - 1]]
        if current is not None:
            owner[nodes[i].name] = current
    return owner
