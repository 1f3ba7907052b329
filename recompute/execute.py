"""Execution of the canonical strategy (Kusumoto §3) as a real autograd training step.

Forward computes V_1 … V_k once, in the traced order, under ``torch.autograd.graph.saved_tensors_hooks``.
What autograd saves for backward is packed in one of three ways:

* saved while running a node that the plan recomputes (V_i \\ ∂(L_i), i < k): a *replay handle*
  (node, j) — the j-th tensor that node saved. Nothing is held, so the value dies at its last
  forward use;
* saved while running any other node, but aliasing the output of a recomputed node (e.g. a cached
  BatchNorm output whose backward needs the discarded convolution output): a *value handle* (the fx
  node plus the view geometry);
* anything else (cached boundaries ∂(L_i), the last block V_k, parameters): kept as autograd keeps it.

The first handle of block i unpacked in backward recomputes V_i \\ ∂(L_i) from the cached values
(∂(L_{i-1}) and ∂(L_i) ∩ V_i), re-running each node with autograd recording under a hook that
captures what it saves; every captured tensor is dropped as soon as it has been unpacked. The
backward graph is the one built by the forward pass, so gradients are those of plain training.

Exactness beyond gradients:
* BatchNorm running statistics: the functional graph returns them; they are written to the buffers
  once, after the forward pass, never by recomputation, and ops read the pre-step buffer values;
* random ops (dropout): the generator state before each recomputed random node is saved in forward
  and restored to replay it, and the caller's generator state is restored after recomputation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.utils._pytree import tree_unflatten

from .fxnodes import output_tensors, run_node as _call
from .graph import Graph
from .plan import Plan
from .trace import Program

__all__ = ["execute", "Executor"]


@dataclass(frozen=True)
class _Replay:
    """The j-th tensor that recomputed fx node ``node`` saved for backward."""

    node: str
    j: int


@dataclass(frozen=True)
class _Value:
    """A view (size, stride, offset) of output ``index`` of recomputed fx node ``node``."""

    node: str
    index: int | None
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def _random(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags


class _RNG:
    """Save and restore the generator states of the devices a step runs on."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def get(self) -> tuple:
        return (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.cuda else None)

    def set(self, state: tuple) -> None:
        torch.set_rng_state(state[0])
        if self.cuda:
            torch.cuda.set_rng_state(state[1], self.device)


class Executor:
    """Runs ``program`` under ``plan``; call it with the model's inputs like the model itself.

    The schedule (which fx nodes each block recomputes, what it reads, when forward values die) is
    computed once here; each call is one forward pass whose backward follows the plan.
    """

    def __init__(self, graph: Graph, plan: Plan, module: torch.nn.Module):
        if graph.program is None:
            raise ValueError("this graph has no executable program: build it with recompute.trace(model, inputs)")
        self.graph, self.plan, self.module = graph, plan, module
        p: Program = graph.program
        self.program = p
        block_of_v = {}
        for i, block in enumerate(plan.blocks):
            for v in block:
                block_of_v[v] = i
        recomputed = plan.recomputed()
        self.order: list[fx.Node] = [n for n in p.gm.graph.nodes if n.name in p.group]
        self.block: dict[str, int] = {n.name: block_of_v[p.group[n.name]] for n in self.order}
        self.discarded: set[str] = {n.name for n in self.order if p.group[n.name] in recomputed}
        self.replay: list[list[fx.Node]] = [[] for _ in plan.blocks]
        for n in self.order:
            if n.name in self.discarded:
                self.replay[self.block[n.name]].append(n)
        # values that block i's recomputation reads from outside itself: they are kept from the forward
        # pass (cached boundaries, inputs, parameters, prologue) until that recomputation has run
        self.reads: list[set[str]] = []
        for nodes in self.replay:
            inside = {n.name for n in nodes}
            self.reads.append({a.name for n in nodes for a in n.all_input_nodes} - inside)
        self.keep_count = Counter(name for reads in self.reads for name in reads)
        position = {n.name: i for i, n in enumerate(self.order)}
        self.last_use: dict[int, list[str]] = defaultdict(list)
        outputs = {n.name for n in p.user_outputs} | set(p.buffer_writes)
        for n in self.order:
            if n.name in outputs:
                continue
            users = [position[u.name] for u in n.users if u.name in position]
            self.last_use[max(users) if users else position[n.name]].append(n.name)
        self.random = {n.name for n in self.order if _random(n) and n.name in self.discarded}

    def __call__(self, *inputs: torch.Tensor, state: dict[str, torch.Tensor] | None = None) -> Any:
        """One forward pass; ``state`` (FQN → tensor) replaces the module's parameters and buffers,
        as in ``torch.func.functional_call`` (the ``fake`` backend passes FakeTensor copies)."""
        return _Step(self, state).run(inputs)


class _Step:
    """The state of one forward/backward pass: packed handles, kept values, recomputed values."""

    def __init__(self, ex: Executor, state: dict[str, torch.Tensor] | None):
        self.ex = ex
        self.state = state
        self.kept: dict[str, Any] = {}  # outside values block recomputations will read
        self.keep_left = Counter(ex.keep_count)
        self.captured: dict[_Replay, torch.Tensor] = {}
        self.values: dict[str, Any] = {}  # recomputed values awaiting value-handle unpacks
        self.value_left: Counter[str] = Counter()
        self.done: set[int] = set()
        self.rng_states: dict[str, tuple] = {}
        self.rng: _RNG | None = None
        self.current: fx.Node | None = None
        self.saves = 0
        self.aliases: dict[int, tuple[str, int | None]] = {}

    # -- forward ---------------------------------------------------------------------------------
    def bind(self, inputs: Sequence[torch.Tensor], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        p, module = self.ex.program, self.ex.module
        if len(inputs) != len(p.user_inputs):
            raise TypeError(f"the traced model takes {len(p.user_inputs)} tensor inputs, got {len(inputs)}")
        written = set(p.buffer_writes.values())
        env: dict[str, Any] = {}
        for name, fqn in p.params.items():
            env[name] = tensors[fqn]
        for name, fqn in p.buffers.items():
            buf = tensors[fqn] if fqn in tensors else _attr(module, fqn)
            # ops must read the pre-step value even when recomputed after the buffer was updated
            env[name] = buf.clone() if fqn in written else buf
        for name, x in zip(p.user_inputs, inputs):
            env[name] = x
        return env

    def run(self, inputs: Sequence[torch.Tensor]) -> Any:
        ex, p = self.ex, self.ex.program
        tensors = self.state if self.state is not None else module_state(ex.module)
        env = self.bind(inputs, tensors)
        device = inputs[0].device if inputs else torch.device("cpu")
        self.rng = _RNG(device)
        for node in p.prologue:
            env[node.name] = _call(node, env)
        for name in ex.keep_count:
            if name in env:
                self.kept[name] = env[name]
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            for i, node in enumerate(ex.order):
                if node.name in ex.random:
                    self.rng_states[node.name] = self.rng.get()
                self.current, self.saves = node, 0
                self.aliases = self._discarded_inputs(node, env)
                env[node.name] = _call(node, env)
                if node.name in ex.keep_count:
                    self.kept[node.name] = env[node.name]
                for dead in ex.last_use.get(i, ()):
                    env.pop(dead, None)
        self.current, self.aliases = None, {}
        with torch.no_grad():
            for out_name, fqn in p.buffer_writes.items():
                tensors[fqn].copy_(env[out_name])
        outs = [env[n.name] for n in p.user_outputs]
        return tree_unflatten(outs, p.out_spec) if p.out_spec is not None else outs

    def _discarded_inputs(self, node: fx.Node, env: dict[str, Any]) -> dict[int, tuple[str, int | None]]:
        """Storages of the recomputed values a kept node reads: what it saves of them is a value handle."""
        if node.name in self.ex.discarded:
            return {}
        out = {}
        for a in node.all_input_nodes:
            if a.name in self.ex.discarded:
                for index, t in output_tensors(env[a.name]):
                    out[t.untyped_storage()._cdata] = (a.name, index)
        return out

    def pack(self, t: torch.Tensor) -> Any:
        node = self.current
        if node is None:
            return t
        if node.name in self.ex.discarded:
            handle = _Replay(node.name, self.saves)
            self.saves += 1
            return handle
        owner = self.aliases.get(t.untyped_storage()._cdata)
        if owner is None:
            return t
        self.value_left[owner[0]] += 1
        return _Value(owner[0], owner[1], tuple(t.size()), tuple(t.stride()), t.storage_offset())

    # -- backward --------------------------------------------------------------------------------
    def unpack(self, handle: Any) -> torch.Tensor:
        if isinstance(handle, torch.Tensor):
            return handle
        block = self.ex.block[handle.node]
        if isinstance(handle, _Replay):
            if handle not in self.captured:
                self.recompute(block)
            return self.captured.pop(handle)
        if handle.node not in self.values:
            self.recompute(block)
        val = self.values[handle.node]
        base = val if handle.index is None else val[handle.index]
        self.value_left[handle.node] -= 1
        if self.value_left[handle.node] <= 0:
            del self.values[handle.node]
        return base.as_strided(handle.size, handle.stride, handle.offset)

    def recompute(self, block: int) -> None:
        """Recover V_i \\ ∂(L_i) from the cache and re-record what each node saves (§3, backward step 1)."""
        ex = self.ex
        env: dict[str, Any] = {name: self.kept[name] for name in ex.reads[block]}
        nodes = ex.replay[block]
        remaining = Counter(a.name for n in nodes for a in n.all_input_nodes)
        outer = self.rng.get() if any(n.name in ex.random for n in nodes) else None
        for node in nodes:
            if node.name in ex.random:
                self.rng.set(self.rng_states[node.name])
            saved: list[torch.Tensor] = []
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t), lambda _: None
            ):
                env[node.name] = _call(node, env)
            for j, t in enumerate(saved):
                self.captured[_Replay(node.name, j)] = t
            if self.value_left[node.name] > 0:
                self.values[node.name] = env[node.name]
            for a in node.all_input_nodes:
                remaining[a.name] -= 1
                if remaining[a.name] == 0:
                    env.pop(a.name, None)
        if outer is not None:
            self.rng.set(outer)
        if block not in self.done:
            self.done.add(block)
            for name in ex.reads[block]:
                self.keep_left[name] -= 1
                if self.keep_left[name] == 0:
                    self.kept.pop(name, None)


def module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by fully qualified name (tied ones under every name)."""
    return {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}


def _attr(module: torch.nn.Module, fqn: str) -> Any:
    for part in fqn.split("."):
        module = getattr(module, part)
    return module


def execute(graph: Graph, plan: Plan, module: torch.nn.Module | None = None) -> Executor:
    """An :class:`Executor` for ``plan`` on the traced ``graph``; ``module`` defaults to the traced model."""
    return Executor(graph, plan, module if module is not None else graph.program.module)
