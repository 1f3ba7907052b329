"""PyTorch's own checkpointing methods, as baselines beside the planners: ``method="torch_..."``.

A baseline plans no schedule: it wraps the module so that its training step runs under one of the
methods a user reaches for without us,

* ``torch_checkpoint_sequential`` — ``torch.utils.checkpoint.checkpoint_sequential`` with √n segments
  over a sequential decomposition of the model (its ``torch.fx`` graph cut where one value is live);
* ``torch_checkpoint_blocks`` — one ``torch.utils.checkpoint.checkpoint`` per block, the hand-written
  pattern: residual blocks, DenseNet's dense layers, Inception blocks, U-Net decoder blocks, VGG stages;
* ``torch_sac`` — selective activation checkpointing per block, as users apply it: the outputs of
  the ops its policy names are saved, everything else is recomputed (``compute_intensive``: the ops
  torch's partitioners call compute-intensive, convolutions and matmuls; ``matmul``: ``aten.mm``, the
  policy of ``torch.utils.checkpoint``'s documentation);
* ``torch_compile_budget`` — ``torch.compile`` with the min-cut partitioner under
  ``torch._functorch.config.activation_memory_budget`` (and, optionally, ``aggressive_recomputation``).

Each is registered here (:func:`baseline`), in a registry of its own beside the planners' (they plan
nothing); its options are read off its signature and checked like a planner's
(:func:`recompute.capture.validate.check_options`), and :func:`recompute.optimize` returns a
:class:`BaselineModule`. None of them is exact
the way an executed plan is: the checkpoint variants update BatchNorm statistics again when they
recompute, and compiled code draws dropout masks from its own generator
(:func:`recompute.doors.exactness.compare` reports it).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import fx, nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, checkpoint_sequential,
                                    create_selective_checkpoint_contexts)

from recompute.capture.validate import check_options, keyword_options
from recompute.planners.registry import elsewhere
from recompute.doors.wrapper import ModelWrapper, model_signature

__all__ = ["Baseline", "BaselineModule", "Unsupported", "UnsupportedBackend", "NoBlocks", "blocks", "register_block", "names", "spec",
           "COMPILE_BACKENDS"]

Forward = Callable[..., Any]  # the training forward of a wrapped model: inputs → outputs

COMPILE_BACKENDS = ("inductor", "aot_eager_decomp_partition")  # torch.compile backends with the min-cut partitioner


class Unsupported(ValueError):
    """A baseline that cannot run here: a model it does not apply to, a backend that cannot run it."""


class UnsupportedBackend(Unsupported):
    """A measurement backend that cannot run a baseline (torch.compile under FakeTensor)."""

    def __init__(self, method: str, backend: str, backends: tuple[str, ...]):
        self.method, self.backend, self.backends = method, backend, backends
        super().__init__(f"{method} cannot be measured on the {backend!r} backend; it runs on {', '.join(backends)}")


class NoBlocks(Unsupported):
    """``torch_checkpoint_blocks`` on a model in which it recognises no block."""


@dataclass(frozen=True)
class Baseline:
    """A registered baseline: ``fn(model, **options) -> forward``, the options it takes with their
    defaults (read off its signature), and the measurement backends that can run it."""

    name: str
    fn: Callable[..., Forward]
    defaults: Mapping[str, Any]
    backends: tuple[str, ...]

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.defaults)

    def check(self, *, strategy: Any = None, budget: Any = None, options: Mapping[str, Any] | None = None) -> None:
        """Refuse a strategy, a budget or an option it does not take, before any work."""
        takes = ", ".join(self.defaults) or "none"
        for arg, value in (("strategy", strategy), ("budget", budget)):
            if value is not None:
                raise TypeError(f"{self.name!r} is one of PyTorch's own methods and takes no {arg} (it plans nothing; "
                                f"got {arg}={value!r}); its options: {takes}")
        check_options(f"baseline {self.name!r}", self.defaults, options or {})


_REGISTRY: dict[str, Baseline] = {}


def baseline(name: str, *, backends: tuple[str, ...] = ("cpu", "cuda", "fake")) -> Callable[[Callable[..., Forward]], Callable[..., Forward]]:
    """Register ``fn(model, **options) -> forward`` as baseline ``name``, measurable on ``backends``."""

    def deco(fn: Callable[..., Forward]) -> Callable[..., Forward]:
        _REGISTRY[name] = Baseline(name, fn, keyword_options(fn), backends)
        elsewhere(name, "it is one of PyTorch's own checkpointing methods: it wraps the module and plans no schedule; "
                        f"use recompute.optimize(model, inputs, method={name!r})")
        return fn

    return deco


def names() -> list[str]:
    """The registered baselines (PyTorch's own methods)."""
    return sorted(_REGISTRY)


def spec(name: str) -> Baseline:
    """The registry entry of baseline ``name``; ValueError naming the registered ones otherwise."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown baseline {name!r}; choose one of {', '.join(names())}")
    return _REGISTRY[name]


class BaselineModule(ModelWrapper):
    """``model`` (its parameters and buffers shared) trained under one of PyTorch's methods.

    Evaluation (``eval()`` or ``torch.no_grad()``) calls the model unchanged. Its recomputation reads
    the model's parameters again during backward, so :func:`recompute.measure` swaps another state
    in (the ``fake`` backend's) for the whole step, not for the forward call alone. The method's
    forward is a closure over the model it was made for: a copy (``copy.deepcopy``, ``pickle``) builds
    it again around its own model (holding the original's, it would train the original), and so does
    a training call after the model changed (:func:`~recompute.doors.wrapper.model_signature`).
    """

    def __init__(self, model: nn.Module, method: str, options: Mapping[str, Any]):
        super().__init__(model)
        self.method, self.options = method, dict(options)
        self.backends = _REGISTRY[method].backends
        self._build()

    def _build(self) -> None:
        self._train_forward = spec(self.method).fn(self.model, **self.options)
        self._built_for = model_signature(self.model)  # after building: some methods set inplace=False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_train_forward"], state["_built_for"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._build()

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*inputs, **kwargs)
        if model_signature(self.model) != self._built_for:  # a module replaced: checkpoint_sequential's stages hold the old one
            self._build()
        return self._train_forward(*inputs, **kwargs)

    def check_backend(self, backend: str) -> None:
        """:class:`UnsupportedBackend` where ``backend`` cannot run this baseline."""
        if backend not in self.backends:
            raise UnsupportedBackend(self.method, backend, self.backends)


def _out_of_place(model: nn.Module) -> None:
    """Turn the model's in-place modules (``nn.ReLU(inplace=True)``, ...) out of place, for good: the
    same values, but no op overwrites a checkpoint's input or a tensor SAC keeps (torch raises), and
    the recomputation in backward runs the very ops of the forward."""
    for m in model.modules():
        if getattr(m, "inplace", None) is True:
            m.inplace = False


# --------------------------------------------------------------------------- checkpoint_sequential


def _stages(model: nn.Module) -> list[Callable[[Any], Any]]:
    """The model as a sequence of functions, each taking the one value live between them.

    The forward's ``torch.fx`` graph is cut after every op at which exactly one value is live (read
    later); the first stage takes the inputs (a tuple where the model takes several).
    """
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:  # fx raises many kinds for code it cannot trace
        raise Unsupported(f"torch_checkpoint_sequential needs a model torch.fx can trace to cut it into "
                         f"sequential stages; {type(model).__name__}: {type(e).__name__}: {e}") from e
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    for n in nodes:  # functional in-place calls (torchvision's GoogLeNet: F.relu(x, inplace=True)), as modules'
        if n.op == "call_function" and n.kwargs.get("inplace") is True:
            n.kwargs = {**n.kwargs, "inplace": False}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    result = output.args[0]
    if not nodes or result is not nodes[-1]:  # the model returns no single value computed last (a tuple, an input)
        raise Unsupported(f"torch_checkpoint_sequential: {type(model).__name__} returns {result!r}, not its last op's value")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    last_use = {n: max(order[u] for u in n.users) for n in gm.graph.nodes if n.users}
    live, cuts = set(placeholders), []
    for n in nodes:
        live = {m for m in live if last_use[m] > order[n]} | ({n} if n.users else set())
        if live == {n}:
            cuts.append(n)
    if cuts[-1] is not nodes[-1]:
        cuts.append(nodes[-1])
    stages: list[Callable[[Any], Any]] = []
    start, first = 0, True
    for cut in cuts:
        end = nodes.index(cut) + 1
        ins = placeholders if first else [nodes[start - 1]]
        stages.append(functools.partial(_run_nodes, gm, ins, nodes[start:end], cut, len(placeholders) > 1 and first))
        start, first = end, False
    return stages


def _traced_arguments(signature: inspect.Signature, inputs: tuple, kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """A call's arguments, bound to the forward's ``signature`` (defaults filled in), in the order of the
    fx graph's placeholders. torch.fx traced every argument as a tensor (an ``if mask is not None`` took
    the tensor's branch), so another value is refused: passed on, it would run the wrong branch, or be
    unpacked over the placeholders (one input for two made each a row of it)."""
    bound = signature.bind(*inputs, **kwargs)
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"torch_checkpoint_sequential runs the forward torch.fx traced with every argument a "
                            f"tensor; argument {name!r} is {type(value).__name__}: pass a tensor, or use a "
                            "planner (recompute.optimize(model) keeps non-tensor arguments as constants of the step)")
    return tuple(bound.arguments.values())


def _run_nodes(gm: fx.GraphModule, ins: list[fx.Node], nodes: list[fx.Node], out: fx.Node, packed: bool, value: Any) -> Any:
    """Interpret ``nodes`` of ``gm`` from the value(s) of ``ins``; the value of ``out``."""
    env: dict[fx.Node, Any] = dict(zip(ins, value if packed else (value,)))
    interp = fx.Interpreter(gm)
    for n in nodes:
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: env[a] if a.op != "get_attr" else interp.fetch_attr(a.target))
        env[n] = getattr(interp, n.op)(n.target, args, kwargs)
    return env[out]


@baseline("torch_checkpoint_sequential")
def torch_checkpoint_sequential(model: nn.Module, *, segments: int = 0) -> Forward:
    """``checkpoint_sequential`` over the model's sequential stages in ``segments`` segments
    (0: ⌈√n⌉ for n stages, Chen et al.'s choice); in-place modules and calls are turned out of place."""
    if segments < 0:
        raise ValueError(f"torch_checkpoint_sequential: segments={segments}; must be 0 (⌈√n⌉) or positive")
    stages = _stages(model)
    _out_of_place(model)
    k = segments or math.ceil(math.sqrt(len(stages)))
    k = min(k, len(stages))
    signature = inspect.signature(model.forward)

    def forward(*inputs: Any, **kwargs: Any) -> Any:
        values = _traced_arguments(signature, inputs, kwargs)
        return checkpoint_sequential(stages, k, values if len(values) > 1 else values[0], use_reentrant=False)

    return forward


# --------------------------------------------------------------------------- one checkpoint per block


def _block_types() -> tuple[type, ...]:
    """Residual blocks (torchvision's), DenseNet's dense layers (Pleiss et al.'s memory-efficient
    DenseNet checkpoints these), Inception blocks, smp U-Net decoder blocks, transformer layers
    (torchvision's ViT encoder blocks, every Hugging Face layer its own gradient checkpointing wraps),
    MobileNet's inverted residuals, and the types registered (:func:`register_block`)."""
    from torchvision.models.densenet import _DenseLayer
    from torchvision.models.googlenet import Inception
    from torchvision.models.mobilenetv2 import InvertedResidual as MobileNetV2Block
    from torchvision.models.mobilenetv3 import InvertedResidual as MobileNetV3Block
    from torchvision.models.resnet import BasicBlock, Bottleneck
    from torchvision.models.vision_transformer import EncoderBlock

    types: list[type] = [BasicBlock, Bottleneck, _DenseLayer, Inception, EncoderBlock, MobileNetV2Block,
                         MobileNetV3Block, *_REGISTERED_BLOCKS]
    layers = sys.modules.get("transformers.modeling_layers")  # a Hugging Face model's layers, where one is loaded
    if layers is not None:
        types.append(layers.GradientCheckpointingLayer)
    with contextlib.suppress(ImportError):
        from segmentation_models_pytorch.decoders.unet.decoder import UnetCenterBlock, UnetDecoderBlock

        types += [UnetDecoderBlock, UnetCenterBlock]
    return tuple(types)


_REGISTERED_BLOCKS: list[type] = []


def register_block(cls: type) -> type:
    """Make ``torch_checkpoint_blocks`` and ``torch_sac`` take the modules of class ``cls`` as blocks
    (a model zoo's own residual blocks, a user's transformer layer); usable as a class decorator."""
    if cls not in _REGISTERED_BLOCKS:
        _REGISTERED_BLOCKS.append(cls)
    return cls


def _is_stages(m: nn.Module) -> bool:
    """A plain ``nn.Sequential`` with max-pools (VGG's ``features``): checkpointed stage by stage."""
    return type(m) is nn.Sequential and any(isinstance(k, nn.MaxPool2d) for k in m)


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost blocks of ``model`` by name: modules of :func:`_block_types` and the ``features``
    of torchvision's VGG (checkpointed stage by stage, a stage ending at a max-pool). A sequence that
    its parent runs module by module (smp's VGG encoder, a VGG with its own forward) is no block."""
    from torchvision.models.vgg import VGG

    types = _block_types()
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if any(name.startswith(f"{b}.") for b, _ in found):
            continue
        if isinstance(m, VGG) and type(m).forward is VGG.forward and _is_stages(m.features):
            found.append((f"{name}.features".lstrip("."), m.features))
        elif isinstance(m, types):
            found.append((name, m))
    return found


def _vgg_stages(seq: nn.Sequential, context: Callable[[], Any] | None = None) -> Forward:
    """``seq``'s forward with each stage (modules up to and including a max-pool) checkpointed (under
    ``context``, a selective policy, where given)."""
    stages: list[nn.Sequential] = []
    run: list[nn.Module] = []
    for m in seq:
        run.append(m)
        if isinstance(m, nn.MaxPool2d):
            stages.append(nn.Sequential(*run))
            run = []
    if run:
        stages.append(nn.Sequential(*run))

    def forward(x: torch.Tensor) -> torch.Tensor:
        for stage in stages:
            x = checkpoint(stage, x, use_reentrant=False, **_context(context))
        return x

    return forward


def _context(context: Callable[[], Any] | None) -> dict[str, Any]:
    """``checkpoint``'s keyword for a selective policy's contexts (none: plain checkpointing)."""
    return {} if context is None else {"context_fn": context}


def _checkpointed(m: nn.Module, context: Callable[[], Any] | None = None) -> Forward:
    """``m``'s forward under ``checkpoint`` (with a selective policy's ``context``, where given); a
    list argument (DenseNet's previous features, which its dense block appends to afterwards) is
    passed as a tuple, so that recomputation reads the same ones."""
    plain = type(m).forward.__get__(m)

    def forward(*args: Any, **kwargs: Any) -> Any:
        args = tuple(tuple(a) if isinstance(a, list) else a for a in args)
        return checkpoint(plain, *args, use_reentrant=False, **_context(context), **kwargs)

    return forward


@contextlib.contextmanager
def _patched(found: list[tuple[str, nn.Module]], context: Callable[[], Any] | None = None) -> Iterator[None]:
    """Each block's ``forward`` checkpointed while the context lasts (the model is left as it was)."""
    for _, m in found:
        m.forward = _vgg_stages(m, context) if _is_stages(m) else _checkpointed(m, context)
    try:
        yield
    finally:
        for _, m in found:
            del m.forward


@baseline("torch_checkpoint_blocks")
def torch_checkpoint_blocks(model: nn.Module) -> Forward:
    """One ``checkpoint`` per block (:func:`blocks`); :class:`NoBlocks` for a model without any."""
    found = blocks(model)
    if not found:
        raise NoBlocks(f"torch_checkpoint_blocks found no block in {type(model).__name__} (it knows "
                       f"{', '.join(t.__name__ for t in _block_types())} and VGG's features); "
                       "use torch_checkpoint_sequential or a planner")

    def forward(*inputs: Any, **kwargs: Any) -> Any:
        with _patched(found):
            return model(*inputs, **kwargs)

    return forward


# --------------------------------------------------------------------------- selective checkpointing


def _saved_ops(policy: str) -> frozenset[Any]:
    """The ops whose outputs selective checkpointing saves under ``policy`` (see the module docstring)."""
    if policy == "matmul":
        return frozenset({torch.ops.aten.mm.default})
    from torch._functorch.partitioners import get_default_op_list

    packets = get_default_op_list().compute_intensive_ops
    return frozenset(getattr(packet, name) for packet in packets for name in packet.overloads())


SAC_POLICIES = ("compute_intensive", "matmul")


@baseline("torch_sac")
def torch_sac(model: nn.Module, *, policy: str = "compute_intensive") -> Forward:
    """Selective activation checkpointing of each block (:func:`blocks`; the whole forward for a
    model without one), saving the outputs of the ops ``policy`` names and recomputing the rest;
    in-place modules are turned out of place."""
    if policy not in SAC_POLICIES:
        raise ValueError(f"torch_sac: policy={policy!r}; choose one of {', '.join(SAC_POLICIES)}")
    _out_of_place(model)
    saved = _saved_ops(policy)

    def keep(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    context = functools.partial(create_selective_checkpoint_contexts, keep)
    found = blocks(model)

    def forward(*inputs: Any, **kwargs: Any) -> Any:
        if not found:
            return checkpoint(model, *inputs, use_reentrant=False, context_fn=context, **kwargs)
        with _patched(found, context):
            return model(*inputs, **kwargs)

    return forward


# --------------------------------------------------------------------------- torch.compile


@baseline("torch_compile_budget", backends=("cpu", "cuda"))
def torch_compile_budget(model: nn.Module, *, budget_fraction: float = 0.5, backend: str = "inductor",
                         aggressive: bool = False) -> Forward:
    """``torch.compile`` whose min-cut partitioner keeps at most ``budget_fraction`` of the activation
    memory it would save by default (``activation_memory_budget``; 1.0 is plain compile, 0 recomputes
    all it can). ``backend``: ``inductor`` or ``aot_eager_decomp_partition`` (the same partition, run
    op by op: no C++ compiler needed, compiles in seconds). ``aggressive``: the partitioner's
    ``aggressive_recomputation`` (recompute any op it may, not only cheap ones, wherever that saves memory)."""
    if not 0 <= budget_fraction <= 1:
        raise ValueError(f"torch_compile_budget: budget_fraction={budget_fraction!r}; must be in [0, 1]")
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f"torch_compile_budget: backend={backend!r}; choose one of {', '.join(COMPILE_BACKENDS)}")
    import torch._functorch.config as functorch_config
    from torch._dynamo import lookup_backend

    def compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
        return lookup_backend(backend)(gm, example_inputs)

    # a backend of its own: dynamo reuses a graph compiled for the same backend (and the same class, with
    # nn modules inlined) whatever the budget it was partitioned under
    compiled = torch.compile(model, backend=compiler)

    def forward(*inputs: Any, **kwargs: Any) -> Any:
        # the budget is read when the joint graph is partitioned, i.e. while the first call compiles
        with functorch_config.patch(activation_memory_budget=budget_fraction, aggressive_recomputation=aggressive):
            return compiled(*inputs, **kwargs)

    return forward
