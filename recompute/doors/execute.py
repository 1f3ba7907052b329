"""Run a :class:`~recompute.pricing.schedule.Schedule` as written: one fx graph per phase of the step.

The schedule is split at ``backward_start`` into a forward graph (parameters, buffers, inputs →
outputs, new buffer values, and the values the backward phase reads) and a backward graph (those
values and the outputs' gradients → parameter gradients and the gradients of the inputs that
require grad, recomputations included). Both
run inside one ``torch.autograd.Function``, so ``loss.backward()`` drives the backward graph and the
caller's autograd graph stays intact around it. fx's generated code drops every value after its last
use, and the backward graph takes its inputs boxed (a list it clears), so memory follows the schedule:
what :func:`recompute.simulate` replays is what runs.

Exactness beyond gradients:
* BatchNorm running statistics come out of the forward graph and are written to the buffers once;
  recomputed BatchNorms read the updated buffers, which a training-mode BatchNorm's outputs do not
  depend on (any other recomputed reader of a written buffer is refused);
* random ops (dropout): the generator state before each one that is recomputed is saved in the
  forward graph and restored around its recomputation, so the mask is the same, and the caller's
  generator state is put back afterwards.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import _BoxedCodeGen
from torch.utils._pytree import tree_unflatten

from recompute.core.fxnodes import is_random, written_into
from recompute.core.graph import Graph
from recompute.planners.registry import Plan
from recompute.pricing.schedule import Instance, Schedule
from recompute.capture.trace import Program

__all__ = ["execute", "Executor", "module_state"]


def _rng_state(device: torch.device) -> tuple:
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: tuple, device: torch.device) -> tuple:
    """Set the generator state; return the one it replaces."""
    old = _rng_state(device)
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
    return old


def _keep(*_values: Any) -> None:
    """A use that keeps values alive up to this point of the graph (``Schedule.release``)."""


_TRAINING_BATCH_NORM = (torch.ops.aten._native_batch_norm_legit_functional.default,)


class _Graphs:
    """The two fx graphs of a schedule and the names that connect them."""

    def __init__(self, p: Program, s: Schedule, device: torch.device):
        joint = p.joint
        written = set(joint.buffer_writes.values())
        placeholders = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
        fwd, bwd = fx.Graph(), fx.Graph()
        fenv: dict[Instance, fx.Node] = {}
        for n in placeholders:
            if n.name not in joint.tangents:
                fenv[(n.name, 0)] = fwd.placeholder(n.name)
        # constants the model makes in its forward (export lifts them into attributes of the joint
        # module): read from the module in either graph, held like parameters
        constants = joint.gm.graph.find_nodes(op="get_attr")
        fenv.update({(n.name, 0): fwd.get_attr(n.target) for n in constants})
        self.forward_inputs = [n.name for n in placeholders if n.name not in joint.tangents]
        fwd_steps = range(s.backward_start)
        bwd_steps = range(s.backward_start, len(s))
        recomputed_random = {name for name, copy in s.steps[s.backward_start:] if copy > 0 and is_random(joint.node(name))}
        rng_out: dict[str, fx.Node] = {}
        for i in fwd_steps:
            name, copy = s.steps[i]
            node = joint.node(name)
            if name in recomputed_random:
                rng_out[name] = fwd.call_function(_rng_state, (device,))
            fenv[(name, copy)] = self._copy(fwd, node, s.reads[i], fenv, s.into.get(i))
        # values produced before the backward phase and read in it cross over
        crossing: list[Instance] = []
        seen: set[Instance] = set()
        for i in bwd_steps:
            for r in (*s.reads[i], *s.release.get(i, ())):
                if r in fenv and r not in seen and joint.node(r[0]).op != "placeholder":
                    seen.add(r)
                    crossing.append(r)
        outs = [fenv[(n.name, 0)] for n in joint.user_outputs]
        writes = [fenv[(name, 0)] for name in joint.buffer_writes]
        fwd.output((*outs, *writes, *[fenv[c] for c in crossing], *rng_out.values()))
        self.n_outputs, self.n_writes = len(outs), len(writes)
        self.write_targets = list(joint.buffer_writes.values())
        # backward graph: crossing values, rng states, parameters/buffers/inputs it reads, tangents
        benv: dict[Instance, fx.Node] = {}
        for c in crossing:
            benv[c] = bwd.placeholder(f"saved_{c[0]}")
        rng_in = {name: bwd.placeholder(f"rng_{name}") for name in rng_out}
        position = {n.name: k for k, n in enumerate(placeholders)}
        read_placeholders = sorted({r[0] for i in bwd_steps for r in s.reads[i] if r[0] in position
                                    and r[0] not in joint.tangents}, key=position.__getitem__)
        # what recomputations other than training-mode BatchNorm read (one pass: a DenseNet-161 has 483
        # buffers the step writes, and asking each of them over every backward step took seconds per plan)
        read_again = {r[0] for i in bwd_steps if s.steps[i][1] > 0
                      and joint.node(s.steps[i][0]).target not in _TRAINING_BATCH_NORM for r in s.reads[i] if r[1] == 0}
        for name in read_placeholders:
            fqn = joint.buffers.get(name)
            if fqn in written and name in read_again:
                raise NotImplementedError(
                    f"buffer {fqn} is written by the step and read by a recomputed op other than a "
                    "training-mode BatchNorm; recomputing it would see the new value"
                )
            benv[(name, 0)] = bwd.placeholder(name)
        for name in joint.tangents:
            benv[(name, 0)] = bwd.placeholder(name)
        benv.update({(n.name, 0): bwd.get_attr(n.target) for n in constants})
        self.backward_inputs = read_placeholders
        for i in bwd_steps:
            name, copy = s.steps[i]
            node = joint.node(name)
            if copy > 0 and name in rng_in:
                old = bwd.call_function(_set_rng_state, (rng_in[name], device))
                benv[(name, copy)] = self._copy(bwd, node, s.reads[i], benv)
                bwd.call_function(_set_rng_state, (old, device))
            else:
                benv[(name, copy)] = self._copy(bwd, node, s.reads[i], benv, s.into.get(i))
            if i in s.release:
                kept = [benv[r] for r in s.release[i] if r in benv]
                if kept:
                    bwd.call_function(_keep, tuple(kept))
        self.grad_targets = [*joint.param_grads.values(), *joint.input_grads.values()]
        bwd.output(tuple(benv[(g, 0)] for g in joint.gradients))
        bwd.set_codegen(_BoxedCodeGen())
        root = joint.gm  # the two modules take over the constants their get_attr nodes read
        self.fwd = fx.GraphModule(root, fwd, "recompute_forward")
        self.bwd = fx.GraphModule(root, bwd, "recompute_backward")
        self.n_crossing = len(crossing)

    @staticmethod
    def _copy(graph: fx.Graph, node: fx.Node, reads: tuple[Instance, ...], env: dict[Instance, fx.Node],
              into: Instance | None = None) -> fx.Node:
        """``node`` in ``graph`` with its inputs replaced by the instances the schedule reads; where it
        runs in place (``Schedule.into``), its ``out=`` overload writing into that instance (or its in-place variant on it)."""
        by_name = {r[0]: env[r] for r in reads}
        new = graph.node_copy(node, lambda a: by_name[a.name])
        new.meta = dict(node.meta)
        if into is not None:
            new.target, new.kwargs = written_into(node.target, new.kwargs, env[into])
        return new


class _Run(torch.autograd.Function):
    """forward: the forward graph; backward: the backward graph, with the outputs' gradients."""

    @staticmethod
    def forward(ctx: Any, ex: "Executor", values: dict[str, torch.Tensor], *differentiable: torch.Tensor) -> Any:  # type: ignore[override]
        g = ex.graphs
        out = g.fwd(*(values[name] for name in g.forward_inputs))
        outs = out[: g.n_outputs]
        writes = out[g.n_outputs: g.n_outputs + g.n_writes]
        with torch.no_grad():
            for fqn, new in zip(g.write_targets, writes):
                values[ex.program.buffers_inv[fqn]].copy_(new)
        ctx.ex = ex
        ctx.mark_non_differentiable(*(o for o, d in zip(outs, ex.differentiable) if not d))
        ctx.saved = [*out[g.n_outputs + g.n_writes:], *(values[name] for name in g.backward_inputs)]
        ctx.device = ex.device
        del out, writes
        return outs if len(outs) != 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:  # type: ignore[override]
        if torch.is_grad_enabled():  # the engine enables grad mode in a backward only for create_graph=True
            raise RuntimeError(
                "a planned step computes first-order gradients only; this backward asks for their graph "
                "(create_graph=True: a gradient penalty, double backpropagation), and the gradients would "
                "carry no history back to the parameters. What to do: run such a step on the plain model "
                "(the optimized module's .model).")
        if ctx.saved is None:
            raise RuntimeError(
                "this planned step was already run backward: it frees each saved value at its last use, "
                "so retain_graph=True cannot keep them for a second backward. What to do: add the losses "
                "and call backward once (the same gradients), or run the forward again.")
        ex: Executor = ctx.ex
        # the backward graph takes the gradients of the outputs that require grad (the others get zeros here)
        grads = [g for g, d in zip(grads, ex.differentiable) if d]
        args, ctx.saved = [*ctx.saved, *grads], None
        outer = _rng_state(ctx.device) if ex.replays_rng else None
        grads = ex.graphs.bwd(args)
        if outer is not None:
            _set_rng_state(outer, ctx.device)
        # parameters by FQN, inputs by placeholder name: an input traced without grad gets None
        by_target = dict(zip(ex.graphs.grad_targets, grads))
        return (None, None, *(by_target.get(x) for x in ex.program.user_inputs),
                *(by_target.get(f) for f in ex.param_order))


class Executor:
    """Runs ``schedule`` (by default ``plan.schedule``, or the canonical strategy of ``plan`` when it
    has none); call it with the model's inputs like the model itself."""

    def __init__(self, graph: Graph, plan: Plan, module: torch.nn.Module, schedule: Schedule | None = None):
        if graph.program is None:
            raise ValueError("this graph has no executable program: build it with recompute.trace(model, inputs)")
        self.graph, self.plan, self.module = graph, plan, module
        self.program: Program = graph.program
        if schedule is None:
            schedule = plan.runs(graph)
        self.schedule = schedule
        self.program.buffers_inv = {fqn: name for name, fqn in self.program.buffers.items()}
        self.param_order = list(dict.fromkeys(self.program.params.values()))
        self.includes_loss = self.program.loss
        self._graphs: dict[torch.device, _Graphs] = {}
        self.device = torch.device("cpu")
        joint = self.program.joint
        self.replays_rng = any(c > 0 and is_random(joint.node(n)) for n, c in self.schedule.steps)
        self.differentiable = joint.differentiable or (True,) * len(joint.user_outputs)

    @property
    def graphs(self) -> _Graphs:
        if self.device not in self._graphs:
            self._graphs[self.device] = _Graphs(self.program, self.schedule, self.device)
        return self._graphs[self.device]

    def __call__(self, *inputs: torch.Tensor, state: dict[str, torch.Tensor] | None = None) -> Any:
        """One forward pass; ``state`` (FQN → tensor) replaces the module's parameters and buffers,
        as in ``torch.func.functional_call`` (the ``fake`` backend passes FakeTensor copies)."""
        p = self.program
        if len(inputs) != len(p.user_inputs):
            raise TypeError(f"the traced model takes {len(p.user_inputs)} tensor inputs, got {len(inputs)}")
        tensors = state if state is not None else module_state(self.module)
        self.device = inputs[0].device if inputs else torch.device("cpu")
        values: dict[str, torch.Tensor] = {}
        for name, fqn in p.params.items():
            values[name] = tensors[fqn]
        for name, fqn in p.buffers.items():
            values[name] = tensors[fqn]
        for name, x in zip(p.user_inputs, inputs):
            values[name] = x
        params = [tensors[f] for f in self.param_order]
        out = _Run.apply(self, values, *inputs, *params)
        outs = list(out) if isinstance(out, tuple) else [out]
        return tree_unflatten(outs, p.joint.out_spec) if p.joint.out_spec is not None else outs


def module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by fully qualified name (tied ones under every name)."""
    return {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}


def execute(graph: Graph, plan: Plan, module: torch.nn.Module | None = None, schedule: Schedule | None = None) -> Executor:
    """An :class:`Executor` for ``plan`` (or ``schedule``) on the traced ``graph``; ``module`` defaults
    to the traced model."""
    return Executor(graph, plan, module if module is not None else graph.program.module, schedule)
