"""``recompute.backend``: a ``torch.compile`` backend whose partition of the joint graph is our plan.

    model = torch.compile(model, backend=recompute.backend(method="approxdp", strategy="mc"))
    loss = crit(model(x), y); loss.backward(); opt.step()

Dynamo hands every graph it captures to AOTAutograd, which traces its forward and backward into one
functional joint ATen graph and asks a *partition function* to split that into a forward and a
backward module. Ours decides what is saved and what is recomputed:

1. the forward half of the joint graph is condensed into the paper's V, as :func:`recompute.trace`
   does (:func:`recompute.capture.trace.graph_of`); each backward op belongs to the forward op whose
   ``grad_fn`` ran it, read off the ``seq_nr`` AOTAutograd stamps on both;
2. :func:`recompute.plan` solves the recomputation problem on that graph; the plan is compiled into its
   canonical schedule (:func:`recompute.pricing.schedule.canonical`), or a planner that recomputes more than
   once (``revolve``…) hands its own schedule;
3. the two modules are written from the schedule: the forward module runs the forward phase and
   returns, after the graph's outputs, exactly the values the backward phase reads (the cached
   boundaries ∂(L_i), and the inputs and parameters backward ops read); the backward module, for
   i = k, …, 1, recomputes V_i \\ ∂(L_i) right before the backward ops of V_i.
4. with ``remat`` (a weight, :func:`backend`), cheap ops — BatchNorm's normalisation, ReLU, a
   concatenation — are recomputed in the backward from what it keeps where that keeps fewer bytes
   (:mod:`recompute.rewrites.remat`, a minimum cut over the schedule's saved values);
5. with ``split_convolutions``, a convolution's backward that is the last reader of its input runs as
   two ops, the weight's gradient and then the input's, so that the input is freed in between
   (:func:`split_convolution_backwards`: a lower peak for more time).

``runtime="eager"`` runs both modules op by op (generated fx code that drops each value after its
last use, like ``aot_eager``); ``runtime="inductor"`` lets inductor compile them (our partition then
runs where inductor's min-cut partitioner would, after its decompositions and joint-graph passes).

Exactness:

* BatchNorm: the joint graph is functional; the new running statistics are outputs of the forward
  module, which AOTAutograd writes to the buffers once. A recomputed training-mode BatchNorm reads
  those new statistics in place of the buffers (its normalised output depends on neither) and its own
  new statistics go unused.
* Random ops (dropout) are never recomputed: their outputs (the mask, or the random tensor an
  inductor decomposition draws) are kept from the forward pass and recomputation reads those, so the
  masks are the forward's. The eager runtime draws them with eager's kernels in eager's order; inductor
  draws with its own generator unless ``torch._inductor.config.fallback_random = True`` (then its masks
  are eager's). Writes into inputs (inductor's ``copy_`` of BatchNorm statistics) are likewise never
  recomputed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch._dynamo.config
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch._aot_autograd.descriptors import GradAOTOutput, InputMutationAOTOutput
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.compile_utils import fx_graph_cse
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.multiprocessing.reductions import StorageWeakRef

from recompute.capture.convsplit import split_convolution_backwards
from recompute.core.fxnodes import output_tensors, runs_once
from recompute.core.graph import Graph
from recompute.capture.joint import JointProgram, rnn_for_training
from recompute.planners.registry import AUTO, Door, Plan, default_cost_model, plan, spec
from recompute.rewrites.remat import recompute_late, rematerialize
from recompute.pricing.schedule import Instance, Schedule
from recompute.pricing.simulate import simulate, simulate_partition
from recompute.capture.trace import Program, graph_of
from recompute.capture.validate import check_budget, check_cost_model, check_rewrites
from recompute.rewrites.pipeline import with_rewrites

_KEYED_CSE = "extra_node_key" in inspect.signature(fx_graph_cse).parameters  # torch 2.11 lacks it

__all__ = ["backend", "Backend", "Partition", "RUNTIMES", "activation_bytes", "partition_of",
           "with_split_convolutions"]

RUNTIMES = ("eager", "inductor")


@dataclass(eq=False)
class Partition:
    """What the backend did with one joint graph.

    Attributes:
        graph, plan, schedule: G = (V, E) of the joint graph, the plan, and the schedule that runs
            (the canonical one, random ops never recomputed).
        saved: fx names of the values the forward module saves for backward.
        saved_bytes: the bytes of the activations among them (:func:`activation_bytes`).
        peak: the simulated peak (bytes) of ``schedule`` (:func:`recompute.simulate`); the modules
            drop every value after its last read, where the canonical schedule holds a cached one to
            the end of its block's backward, so on the eager runtime this bounds what they hold.
        forward, backward: the two fx modules handed to the runtime's compilers.
    """

    graph: Graph
    plan: Plan
    schedule: Schedule
    saved: list[str]
    saved_bytes: int
    peak: int
    forward: fx.GraphModule
    backward: fx.GraphModule


class Backend:
    """A ``torch.compile`` backend (call it with dynamo's graph and example inputs); ``partitions``
    lists what it did with each joint graph it split, most recent last."""

    def __init__(self, method: str, strategy: str | None, budget: int | None, runtime: str, cost_model: str,
                 remat: float | None, plan_options: dict[str, Any], cost_options: dict[str, Any] | None = None,
                 split_convolutions: bool | None = False, rewrites: dict[str, bool] | None = None):
        self.method, self.strategy, self.budget, self.runtime = method, strategy, budget, runtime
        self.cost_model, self.remat, self.plan_options = cost_model, remat, plan_options
        self.split_convolutions = split_convolutions
        self.rewrites = dict(rewrites or {})
        # dynamo runs RNN modules outside its graphs unless told otherwise: unplanned, and no word of it
        torch._dynamo.config.allow_rnn = True
        self.cost_options = dict(cost_options or {})
        self.partitions: list[Partition] = []

    def __repr__(self) -> str:  # dynamo names the backend by it in its errors
        options = "".join(f", {k}={v!r}" for k, v in self.plan_options.items())
        rewrites = "".join(f", {k}={v!r}" for k, v in self.rewrites.items() if v)
        return (f"recompute.backend({self.method!r}, strategy={self.strategy!r}, budget={self.budget!r}, "
                f"runtime={self.runtime!r}, cost_model={self.cost_model!r}, remat={self.remat!r}, "
                f"split_convolutions={self.split_convolutions!r}{rewrites}{options})")

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        with rnn_for_training():  # an LSTM traced the way it is differentiated (recompute.joint)
            if self.runtime == "eager":
                return aot_module_simplified(gm, example_inputs, fw_compiler=boxed_nop, bw_compiler=boxed_nop,
                                             partition_fn=self.partition)
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": _Inductor(self.partition)})

    def partition(self, joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  static_lifetime_input_indices: list[int] | None = None,
                  **_: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        """AOTAutograd's ``partition_fn``: the forward and backward modules of our plan."""
        _deduplicate(joint_module, num_fwd_outputs)
        joint = _joint_program(joint_module, num_fwd_outputs, set(static_lifetime_input_indices or ()))
        # inductor's compiled modules do not allocate the workspaces the ops take run one by one
        g = graph_of(joint, cost_model=self.cost_model, workspaces=("cuda", "cpu") if self.runtime == "eager" else (),
                     **self.cost_options)
        p = plan(g, self.method, strategy=self.strategy, budget=self.budget, **self.plan_options)
        p = with_rewrites(p, g, **self.rewrites)
        part = partition_of(g, p, num_fwd_outputs, self.remat, bool(self.split_convolutions))
        if self.split_convolutions is None:  # auto: split where that lowers the step's peak
            split = with_split_convolutions(part)
            part = split if split.peak < part.peak else part
        self.partitions.append(part)
        return part.forward, part.backward


def _deduplicate(gm: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Drop the joint graph's dead ops and merge its identical pure ones (common subexpressions), as
    PyTorch's partitioners do before they partition, so that the step runs each computation once. A
    value the backward depends on is not merged with a forward-only one (that would make the forward
    keep it); random ops and writes are never merged (``fx_graph_cse``). An older torch (2.11) cannot key
    the merge, so there it may merge across the two."""
    gm.graph.eliminate_dead_code()
    output = gm.graph.find_nodes(op="output")[0]
    backward = set()
    todo = [o for o in output.args[0][num_fwd_outputs:] if isinstance(o, fx.Node)]
    while todo:
        n = todo.pop()
        if n not in backward:
            backward.add(n)
            todo.extend(n.all_input_nodes)
    if _KEYED_CSE:
        gm.graph = fx_graph_cse(gm.graph, extra_node_key=lambda n: n in backward)
    else:
        gm.graph = fx_graph_cse(gm.graph)


def partition_of(g: Graph, p: Plan, num_fwd_outputs: int, remat: float | None = None,
                 split_convolutions: bool = False) -> Partition:
    """The forward and backward modules of plan ``p`` on the joint graph of ``g`` (random ops kept
    from the forward; with ``remat``, cheap ops recomputed where that keeps fewer bytes and the
    simulated peak does not rise, so that a budget still bounds it, and again before late reads in
    the backward where that lowers the peak; with ``split_convolutions``, the backward's convolution
    backwards split where that frees their input earlier, :func:`split_convolution_backwards`)."""
    # the modules free each value after its last read; they write no output into an input's storage
    s = _kept_from_forward(g.program, replace(p.runs(g), into={}))
    peak = simulate(g.program, s).peak
    if remat is not None:
        cheaper = rematerialize(g.program, s, weight=remat)
        if cheaper is not s and (cheaper_peak := simulate(g.program, cheaper).peak) <= peak:
            s, peak = cheaper, cheaper_peak
        later = recompute_late(g.program, s)  # more recomputation: worth it only for a lower peak
        if later is not s and (later_peak := simulate(g.program, later).peak) < peak:
            s, peak = later, later_peak
    fw, bw, saved = _split(g.program, s, num_fwd_outputs)
    joint = g.program.joint
    part = Partition(graph=g, plan=p, schedule=s, saved=saved,
                     saved_bytes=activation_bytes([joint.node(n) for n in saved]), peak=peak, forward=fw, backward=bw)
    return with_split_convolutions(part) if split_convolutions else part


def with_split_convolutions(part: Partition) -> Partition:
    """``part`` with its backward's convolution backwards split where that frees their input earlier
    (:func:`split_convolution_backwards`, on a copy of the module: ``part`` is left as it is), its peak
    the two modules' simulated one."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(part.backward.graph, {}))
    backward = split_convolution_backwards(_LazyGraphModule(part.backward, graph))
    return replace(part, backward=backward, peak=simulate_partition(part.forward, backward).peak)


class _Inductor(CustomPartitionerFn):
    """Our partition where inductor calls its partitioner (``config.custom_partitioner_fn``)."""

    def __init__(self, partition: Callable[..., tuple[fx.GraphModule, fx.GraphModule]]):
        self.partition = partition

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        kwargs.pop("compiler", None)
        return self.partition(gm, joint_inputs, **kwargs)

    def uuid(self) -> None:
        return None  # the partition depends on the plan's options: never reuse a cached compilation

    def __deepcopy__(self, memo: dict) -> "_Inductor":
        return self  # inductor deep-copies config values when it reads them; plans must land on our Backend


def activation_bytes(saved: Sequence[Any]) -> int:
    """Bytes of the distinct storages of the computed values among ``saved`` (fx nodes of a joint
    graph): what a partition keeps for backward besides the graph's inputs and parameters, each
    storage once however many views of it are saved."""
    nodes = [n for n in saved if isinstance(n, fx.Node)]
    storages: dict[StorageWeakRef, int] = {}
    for n in nodes:
        for _, t in output_tensors(n.meta.get("val")):
            storages[StorageWeakRef(t.untyped_storage())] = t.untyped_storage().nbytes()
    # views of the parameters (a transposed weight) keep nothing alive
    inputs = {StorageWeakRef(t.untyped_storage()) for g in {n.graph for n in nodes} for p in g.find_nodes(op="placeholder")
              for _, t in output_tensors(p.meta.get("val"))}
    return sum(size for ref, size in storages.items() if ref not in inputs)


def _joint_program(gm: fx.GraphModule, num_fwd_outputs: int, static: set[int]) -> JointProgram:
    """AOTAutograd's joint graph as a :class:`JointProgram`.

    Placeholders are the primals (parameters and buffers — the static inputs — then dynamo's inputs, in
    dynamo's order) and the tangents. The outputs are the forward's (new values of mutated buffers,
    then the graph's outputs) and then one gradient per primal. A call is a backward op where
    AOTAutograd tagged it so or where it reads a tangent or a backward op; every other call is forward.
    Each backward op belongs to the first forward op with its ``seq_nr`` (the op that created the
    ``grad_fn``; ops after it that create none, like BatchNorm's counter, share its number).
    """
    placeholders = gm.graph.find_nodes(op="placeholder")
    primals = [n for n in placeholders if n.name.startswith("primals")]
    tangents = [n.name for n in placeholders if n.name.startswith("tangents")]
    if len(primals) + len(tangents) != len(placeholders):
        extra = [n.name for n in placeholders if n not in primals and n.name not in tangents]
        raise NotImplementedError(f"recompute.backend: joint graph inputs {extra} (RNG seeds, tokens) are not supported")
    if any(not isinstance(n.meta.get("val"), torch.Tensor) or any(isinstance(d, torch.SymInt) for d in n.meta["val"].shape)
           for n in placeholders):
        # a saved size would be an output of its own kind (AOTAutograd keeps symbolic sizes apart)
        raise NotImplementedError("recompute.backend plans static shapes only: compile with torch.compile(..., dynamic=False)")
    output = gm.graph.find_nodes(op="output")[0]
    outs, descs = output.args[0], output.meta.get("desc") or [None] * len(output.args[0])
    grads = {d.grad_of.idx: o.name for o, d in zip(outs[num_fwd_outputs:], descs[num_fwd_outputs:])
             if isinstance(d, GradAOTOutput) and isinstance(o, fx.Node)}
    buffer_writes, user_outputs = {}, []
    for o, d in zip(outs[:num_fwd_outputs], descs[:num_fwd_outputs]):
        if isinstance(d, InputMutationAOTOutput) and isinstance(o, fx.Node):
            buffer_writes[o.name] = primals[d.mutated_input.idx].name
        elif isinstance(o, fx.Node):
            user_outputs.append(o)
    backward_names: set[str] = set(tangents)
    forward, backward = [], []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.meta.get("partitioner_tag") == "is_backward" or any(a.name in backward_names for a in n.all_input_nodes):
            backward_names.add(n.name)
            backward.append(n)
        else:
            forward.append(n)
    first: dict[int, str] = {}
    for n in forward:
        first.setdefault(n.meta.get("seq_nr", -1), n.name)
    owner = {n.name: first[n.meta["seq_nr"]] for n in backward if n.meta.get("seq_nr") in first}
    params = {p.name: p.name for i, p in enumerate(primals) if i in static and i in grads}
    return JointProgram(
        gm=gm,
        params=params,
        buffers={p.name: p.name for i, p in enumerate(primals) if i in static and p.name not in params},
        user_inputs=[p.name for i, p in enumerate(primals) if i not in static],
        tangents=tangents,
        user_outputs=user_outputs,
        buffer_writes=buffer_writes,
        param_grads={name: primals[i].name for i, name in grads.items()},
        forward=forward,
        backward=backward,
        owner=owner,
    )


def _kept_from_forward(p: Program, s: Schedule) -> Schedule:
    """``s`` without recomputations of random ops (and of writes into inputs): the members of such a
    node of V are read from the forward pass instead (their values are saved), so every mask is drawn
    once, by the forward pass, as in eager training."""
    once = {m.name for nodes in p.members if any(runs_once(m) for m in nodes) for m in nodes}

    def kept(inst: Instance) -> Instance:
        return (inst[0], 0) if inst[0] in once else inst

    steps, reads, block = [], [], []
    for i, (inst, r) in enumerate(zip(s.steps, s.reads)):
        if inst[0] in once and inst[1] > 0:
            continue
        steps.append(inst)
        reads.append(tuple(kept(x) for x in r))
        block.append(s.block[i] if s.block else 0)
    if len(steps) == len(s.steps):
        return s
    # release points are not used by the split (values die after their last read)
    return Schedule(steps=steps, reads=reads, backward_start=s.backward_start, block=block)


def _split(p: Program, s: Schedule, num_fwd_outputs: int) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """The forward and backward modules of schedule ``s``, in AOTAutograd's calling convention:
    forward(*primals) → (*forward outputs, *saved); backward(*saved, *tangents) → one gradient (or
    None) per primal. Saved are the forward's values (primals included) that the backward phase reads,
    in the order it first reads them."""
    joint = p.joint
    gm = joint.gm
    output = gm.graph.find_nodes(op="output")[0]
    fw_outs, bw_outs = output.args[0][:num_fwd_outputs], output.args[0][num_fwd_outputs:]
    fwd, bwd = fx.Graph(), fx.Graph()
    fenv: dict[Instance, fx.Node] = {}
    for n in gm.graph.find_nodes(op="placeholder"):
        if n.name not in joint.tangents:
            fenv[(n.name, 0)] = _placeholder(fwd, n.name, n)
    # constants the model makes in its forward: each module reads them from the joint module's attributes
    constants = {(n.name, 0): n for n in gm.graph.find_nodes(op="get_attr")}
    fenv.update({r: _constant(fwd, n) for r, n in constants.items()})
    for i in range(s.backward_start):
        fenv[s.steps[i]] = _copy(fwd, joint.node(s.steps[i][0]), s.reads[i], fenv)
    bw_reads = {i: _backward_reads(joint, s, i) for i in range(s.backward_start, len(s))}
    wanted = [r for reads in bw_reads.values() for r in reads]
    wanted += [(o.name, 0) for o in bw_outs if isinstance(o, fx.Node)]
    saved = [r for r in dict.fromkeys(wanted) if r in fenv and r not in constants]
    fwd.output((*(_out(o, fenv) for o in fw_outs), *(fenv[r] for r in saved)))
    benv = {r: _placeholder(bwd, r[0], joint.node(r[0])) for r in saved}
    benv.update({r: _constant(bwd, n) for r, n in constants.items()})
    for name in joint.tangents:
        benv[(name, 0)] = _placeholder(bwd, name, joint.node(name))
    for i in range(s.backward_start, len(s)):
        benv[s.steps[i]] = _copy(bwd, joint.node(s.steps[i][0]), bw_reads[i], benv)
    bwd.output(tuple(_out(o, benv) for o in bw_outs))
    # lazy: their Python code is written when first run (or read), not here; the head-to-head prices
    # hundreds of partitions by their graphs alone, and writing it was a third of a DenseNet-161 split
    return _LazyGraphModule(gm, fwd), _LazyGraphModule(gm, bwd), [r[0] for r in saved]


_TRAINING_BATCH_NORM = (torch.ops.aten._native_batch_norm_legit_functional.default,)


def _backward_reads(joint: JointProgram, s: Schedule, i: int) -> tuple[Instance, ...]:
    """What step ``i`` of the backward phase reads, with one change: a recomputed training-mode
    BatchNorm reads the new running statistics instead of the buffers. AOTAutograd writes the new
    values into the buffers after the forward module, so a saved buffer would fail autograd's version
    check; the normalised output of a training-mode BatchNorm does not depend on them, and its own new
    statistics are not used."""
    new_value = {buffer: new for new, buffer in joint.buffer_writes.items()}
    name, copy = s.steps[i]
    if copy == 0 or not any(r[0] in new_value for r in s.reads[i]):
        return s.reads[i]
    if joint.node(name).target not in _TRAINING_BATCH_NORM:
        raise NotImplementedError(f"recompute.backend: {name} ({joint.node(name).target}) reads a buffer the step "
                                  "writes and is recomputed; only a training-mode BatchNorm may be")
    return tuple((new_value[r[0]], 0) if r[0] in new_value else r for r in s.reads[i])


def _placeholder(graph: fx.Graph, name: str, like: fx.Node) -> fx.Node:
    new = graph.placeholder(name)
    new.meta = dict(like.meta)  # the runtimes read shapes and dtypes off ``meta["val"]``
    return new


def _constant(graph: fx.Graph, like: fx.Node) -> fx.Node:
    new = graph.get_attr(like.target)
    new.meta = dict(like.meta)
    return new


def _copy(graph: fx.Graph, node: fx.Node, reads: tuple[Instance, ...], env: dict[Instance, fx.Node]) -> fx.Node:
    """``node`` in ``graph`` reading the instances the schedule says."""
    by_input = {a.name: env[r] for a, r in zip(node.all_input_nodes, reads)}
    return graph.node_copy(node, lambda a: by_input[a.name])


def _out(o: Any, env: dict[Instance, fx.Node]) -> Any:
    return env[(o.name, 0)] if isinstance(o, fx.Node) else o


def backend(
    method: str = AUTO,
    *,
    strategy: str | None = None,
    budget: int | None = None,
    runtime: str = "eager",
    cost_model: str | None = None,
    cost_options: dict[str, Any] | None = None,
    remat: float | None = None,
    split_convolutions: bool | None = None,
    recompute_late: bool | None = None,
    in_place: bool | None = None,
    recompute_at_peak: bool | None = None,
    **plan_options: Any,
) -> Backend:
    """A ``torch.compile`` backend that trains with the plan of ``method`` (see the module docstring).

    The arguments are :func:`recompute.optimize`'s, and so are the defaults: ``method="auto"`` plans each
    compiled graph for the least peak within ``max_time`` (a plan option, 1.3) × its plain step's
    modelled time, or the least time within ``budget`` (bytes), choosing the schedule rewrites itself
    and splitting convolution backwards where that lowers the partition's peak
    (``split_convolutions=None``). Another planner: ``budget`` in bytes bounds the simulated peak of
    each compiled graph (None: the smallest feasible); ``strategy`` and ``plan_options`` are the
    planner's, its own defaults where not given; ``recompute_late``, ``recompute_at_peak`` and
    ``in_place`` rewrite its schedule as :func:`~recompute.rewrites.pipeline.with_rewrites` does (the modules free every value
    after its last read; an op run in place is priced so but writes a new tensor: the runtime's
    allocator reuses the freed one). ``runtime`` is ``"eager"`` (op by op, no compiler
    needed) or ``"inductor"``. ``cost_options`` go to the cost model (e.g. ``measured``'s ``time_model``,
    :mod:`recompute.capture.costs`). ``remat`` (a weight w ≥ 0; None: off) also recomputes cheap ops
    (pointwise, views, concatenations) in the backward where that keeps more than w bytes per byte
    recomputed (:func:`recompute.rewrites.remat.rematerialize`), if the schedule's simulated peak does not rise.
    ``split_convolutions`` runs each convolution backward that last reads its input as two ops, so that
    the input is freed in between (:func:`split_convolution_backwards`). Checked here, so that a bad
    option fails before compiling; planning happens when dynamo compiles. It turns on
    ``torch._dynamo.config.allow_rnn``: dynamo would otherwise run an LSTM or GRU outside its graphs,
    where no plan reaches it, without a word.
    """
    check_budget(budget)
    cost_model = default_cost_model(method) if cost_model is None else cost_model
    check_cost_model(cost_model, cost_options)
    if remat is not None and not (isinstance(remat, (int, float)) and not isinstance(remat, bool) and remat >= 0):
        raise ValueError(f"remat must be None (off) or a weight ≥ 0 (0: recompute wherever it keeps fewer bytes), got {remat!r}")
    rewrites = check_rewrites({"recompute_late": recompute_late, "recompute_at_peak": recompute_at_peak,
                               "in_place": in_place}, split_convolutions, auto=method == AUTO)
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    spec(method).check(Door.backend, strategy=strategy, budget=budget, options=plan_options)
    split = split_convolutions if method == AUTO else bool(split_convolutions)
    return Backend(method, strategy, budget, runtime, cost_model, remat, plan_options, cost_options, split, rewrites)
