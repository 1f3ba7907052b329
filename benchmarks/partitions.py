"""PyTorch's min-cut partitioner and ours on one joint graph, priced by one simulator and one time model.

``torch.compile`` hands a captured graph to AOTAutograd, which traces forward and backward into one
joint graph and asks a partition function to split it into a forward and a backward module. Here
the joint graph is captured once (:func:`capture`): the model is compiled with a backend that
records what the partition function receives, with the decompositions inductor applies (those of
``aot_eager_decomp_partition``), and the model and inputs may live on the ``meta`` device, so the
paper's batch costs no memory. Then any partition function runs on copies of it:

* :func:`torch_partition` — ``min_cut_rematerialization_partition`` under an
  ``activation_memory_budget`` and an ``activation_memory_budget_solver`` (:data:`SOLVERS`);
* :func:`our_partition` — :class:`recompute.doors.backend.Backend`'s, i.e. ``recompute.backend(...)``, and
  :func:`split_plan` any plan of its graph (another budget's, or with cheap ops recomputed: ``remat=``).

:func:`price` gives a (forward, backward) pair's peak (:func:`recompute.pricing.simulate.simulate_partition`) and predicted seconds
(:mod:`recompute.capture.timing`).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import astuple, dataclass, field
from typing import Any, Callable, Sequence
from unittest import mock

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch import partitioners
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
from torch._guards import detect_fake_mode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._ordered_set import OrderedSet

from recompute.core.storage import state_bytes
from recompute.doors.backend import Backend, Partition, backend, partition_of, with_split_convolutions
from recompute.core.fxnodes import output_tensors
from recompute.core.graph import Graph
from recompute.doors.measure import default_loss
from recompute.planners.registry import DEFAULT_METHOD, Plan
from recompute.pricing.simulate import simulate_partition
from recompute.capture.timing import BatchExtrapolation, TimeModel, module_calls

__all__ = ["SOLVERS", "JointCapture", "Priced", "capture", "torch_partition", "our_partition", "split_plan",
           "split_convolutions", "price", "saved_bytes"]

SOLVERS = ("dp", "greedy", "ilp", "dp_knapsack_sliding_hirschberg")  # activation_memory_budget_solver in torch 2.14


class _WithLoss(torch.nn.Module):
    """The model and its loss as one module, so that the joint graph is the whole training step."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[[Any], torch.Tensor]):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(*inputs))


@dataclass(eq=False)
class JointCapture:
    """One training step's joint graph as AOTAutograd hands it to a partition function.

    Attributes:
        joint: the joint forward-backward graph (its ``meta['val']`` are FakeTensors).
        joint_inputs: the example inputs AOTAutograd passed along with it.
        num_fwd_outputs: how many outputs of ``joint`` are the forward's.
        static_lifetime_input_indices: the primals that are parameters and buffers.
        param_bytes: bytes of the model's parameters and buffers (present before and after the step).
        compiled: the compiled step (forward returns the loss), runnable where the inputs were real.
        forward, backward: the modules the default partition gave the compiled step (what it runs).
        min_cuts: the min-cuts :func:`torch_partition` solved on copies of ``joint`` (by node name).
    """

    joint: fx.GraphModule
    joint_inputs: Any
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int]
    param_bytes: int
    compiled: Callable[..., torch.Tensor] | None = None
    forward: fx.GraphModule | None = None
    backward: fx.GraphModule | None = None
    min_cuts: dict[tuple[str, tuple[str, ...]], tuple[list[str], list[str]]] = field(default_factory=dict, repr=False)

    def partition_kwargs(self) -> dict[str, Any]:
        return {"num_fwd_outputs": self.num_fwd_outputs, "static_lifetime_input_indices": self.static_lifetime_input_indices}

    def copy(self) -> fx.GraphModule:
        """A copy of the joint graph for one partition function (they rewrite what they are given)."""
        with _fake_mode(self):
            return copy.deepcopy(self.joint)


def _fake_mode(c: JointCapture) -> Any:
    mode = detect_fake_mode(c.joint_inputs)
    return mode if mode is not None else contextlib.nullcontext()


def _decompositions() -> dict:
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


def capture(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
            loss_fn: Callable[[Any], torch.Tensor] = default_loss,
            partition_fn: Callable[..., tuple[fx.GraphModule, fx.GraphModule]] = default_partition) -> JointCapture:
    """Compile ``loss_fn(model(*inputs))`` (one graph, static shapes) and run its forward once, which
    captures the joint graph; ``partition_fn`` is what the compiled step then runs with, op by op,
    each value dropped after its last use (``boxed_nop``, as ``aot_eager`` runs). On ``meta``
    tensors nothing is computed (the backward cannot run there; the joint graph is all we need)."""
    found: dict[str, Any] = {}

    def record(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        found.setdefault("joint", copy.deepcopy(joint))
        found.setdefault("inputs", joint_inputs)
        found.setdefault("kwargs", kwargs)
        fw, bw = partition_fn(joint, joint_inputs, **kwargs)
        found["fw"], found["bw"] = fw, bw
        return fw, bw

    torch._dynamo.reset()
    aot = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, decompositions=_decompositions, partition_fn=record,
                       keep_inference_input_mutations=True)
    compiled = torch.compile(_WithLoss(model, loss_fn), backend=aot, fullgraph=True, dynamic=False)
    compiled(*inputs)
    if "joint" not in found:
        raise RuntimeError(f"torch.compile captured no training graph of {type(model).__name__}: does it "
                           "require gradients (parameters with requires_grad, model.train())?")
    kwargs = found["kwargs"]
    param_bytes = state_bytes(model)
    return JointCapture(found["joint"], found["inputs"], kwargs["num_fwd_outputs"],
                        list(kwargs.get("static_lifetime_input_indices") or []), param_bytes, compiled,
                        found["fw"], found["bw"])


def torch_partition(c: JointCapture, budget: float, solver: str = "dp") -> tuple[fx.GraphModule, fx.GraphModule]:
    """``min_cut_rematerialization_partition`` (inductor's recomputable ops) of the captured joint
    graph under ``activation_memory_budget=budget`` and ``activation_memory_budget_solver=solver``."""
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget (activation_memory_budget) must be in [0, 1], got {budget}")
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    joint = c.copy()
    with torch._functorch.config.patch(activation_memory_budget=budget, activation_memory_budget_solver=solver), \
            _fake_mode(c), mock.patch.object(partitioners, "solve_min_cut", _solved_once(c)):
        return min_cut_rematerialization_partition(joint, c.joint_inputs, compiler="inductor", **c.partition_kwargs())


def _solved_once(c: JointCapture) -> Callable[..., tuple[list[fx.Node], Any]]:
    """torch's ``solve_min_cut`` remembered on ``c``. It is a function of the joint graph, the cut's
    options and the nodes not to ban; under a budget below 1 torch solves three cuts that depend on
    neither budget nor solver before the budget's own (DenseNet-161's grid asked for 41 cuts: 180 of
    its 1547 profiled seconds were max-flow)."""
    solve = partitioners.solve_min_cut

    def solved(joint_graph: fx.Graph, node_info: Any, options: Any, dont_ban: Any = None) -> tuple[list[fx.Node], Any]:
        key = repr(astuple(options)), tuple(sorted(n.name for n in dont_ban or ()))
        if key not in c.min_cuts:
            saved, banned = solve(joint_graph, node_info, options, dont_ban)
            c.min_cuts[key] = [n.name for n in saved], [n.name for n in banned]
        saved, banned = c.min_cuts[key]
        by_name = {n.name: n for n in joint_graph.nodes}
        return [by_name[n] for n in saved], OrderedSet(by_name[n] for n in banned)
    return solved


def our_partition(c: JointCapture, method: str = DEFAULT_METHOD, **options: Any) -> tuple[fx.GraphModule, fx.GraphModule, Partition]:
    """``recompute.backend(method, **options)``'s partition of the captured joint graph, and its record
    (priced by the paper's costs unless ``cost_model`` says otherwise: a capture may be on the meta device)."""
    b: Backend = backend(method, **{"cost_model": "paper", **options})
    joint = c.copy()
    with _fake_mode(c):
        fw, bw = b.partition(joint, c.joint_inputs, **c.partition_kwargs())
    return fw, bw, b.partitions[-1]


def split_plan(c: JointCapture, g: Graph, p: Plan, remat: float | None = None,
               split_convolutions: bool = False) -> Partition:
    """Plan ``p`` of ``g`` (the graph a partition of ``c`` was planned on) split into the forward and
    backward modules ``recompute.backend(..., remat=remat, split_convolutions=...)`` makes of it,
    without planning again."""
    with _fake_mode(c):
        return partition_of(g, p, c.num_fwd_outputs, remat, split_convolutions)


def split_convolutions(c: JointCapture, part: Partition) -> Partition:
    """A split of :func:`split_plan` (without ``split_convolutions``) as ``split_plan(...,
    split_convolutions=True)`` makes it, without splitting the plan again."""
    with _fake_mode(c):
        return with_split_convolutions(part)


@dataclass
class Priced:
    """A partition's peak (bytes, parameters, buffers and gradients included) and predicted seconds."""

    peak: int
    seconds: float
    saved_bytes: int


def price(c: JointCapture, forward: fx.GraphModule, backward: fx.GraphModule,
          time_model: TimeModel | BatchExtrapolation) -> Priced:
    """``forward`` and ``backward``'s peak (:func:`recompute.pricing.simulate.simulate_partition`, the simulator's
    storage table, plus the parameters and buffers) and their
    ops' predicted seconds under ``time_model``."""
    return Priced(peak=simulate_partition(forward, backward).peak + c.param_bytes,
                  seconds=time_model.seconds([*module_calls(forward), *module_calls(backward)]),
                  saved_bytes=saved_bytes(forward, backward))


def saved_bytes(forward: fx.GraphModule, backward: fx.GraphModule) -> int:
    """Bytes of the distinct storages the backward reads from the forward that are not the forward's
    inputs (parameters, buffers, the step's inputs): the activations a partition keeps."""
    inputs = _storages(forward.graph.find_nodes(op="placeholder"))
    kept = _storages(n for n in backward.graph.find_nodes(op="placeholder") if not n.name.startswith("tangents"))
    return sum(nbytes for ref, nbytes in kept.items() if ref not in inputs)


def _storages(nodes: Any) -> dict[StorageWeakRef, int]:
    return {StorageWeakRef(t.untyped_storage()): t.untyped_storage().nbytes()
            for n in nodes for _, t in output_tensors(n.meta.get("val"))}
