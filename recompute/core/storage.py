"""The storage table: which storage each value of an fx graph lives in, its size, and who reads it.

Every pricing of a schedule — the simulator (:mod:`recompute.pricing.simulate`), the DPs' block costs
(:mod:`recompute.pricing.blockcost`) and the MILP's program (:mod:`recompute.planners.milp`) — needs the same
facts about the values of a graph: an op allocates one storage per tensor output; a view or a
``getitem`` allocates nothing and keeps its base's storage alive (a ``getitem`` of a multi-output op
only the element it takes); and a storage lives while some value aliasing it is still to be read.
:class:`StorageTable` resolves that once, for any ``torch.fx`` graph whose nodes carry
``meta["val"]`` (FakeTensors or real ones): the joint graph of a traced step, or the forward and
backward modules AOTAutograd's partitioner returns (``received`` links a backward placeholder to the
forward value it is handed). Placeholders and constants are storages too; whether one is counted
(created by the step, or given before it) is the pricing's decision, not the table's.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import torch
import torch.fx as fx

from recompute.core.fxnodes import output_tensors

__all__ = ["StorageTable", "Counted", "is_alias", "joint_table", "tensor_bytes", "state_bytes"]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each tensor once (a tied parameter listed under each of its names is one)."""
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def state_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers: what a step holds before it starts."""
    return tensor_bytes([*model.parameters(), *model.buffers()])


def is_alias(node: fx.Node) -> bool:
    """Views and ``getitem`` share their base's storage: they allocate nothing."""
    t = node.target
    return t is operator.getitem or (isinstance(t, torch._ops.OpOverload) and t.is_view)


@dataclass(frozen=True, eq=False)
class StorageTable:
    """The storages of an fx graph's values, numbered in graph order (a node's outputs in order).

    Attributes:
        size: (S,) bytes of each storage.
        maker: the node that allocates each storage (an op, a placeholder or a constant).
        made: every node that is no alias → its storages, one per tensor output (empty for none).
        of: node → the storages a read of it keeps alive: its own, or for an alias its base's (one
            element for a ``getitem`` of a multi-output op); absent for an alias of nothing.
        readers: (S,) the nodes that read each storage, directly or through an alias, in graph order.
    """

    size: np.ndarray
    maker: tuple[fx.Node, ...]
    made: Mapping[fx.Node, tuple[int, ...]]
    of: Mapping[fx.Node, tuple[int, ...]]
    readers: tuple[tuple[fx.Node, ...], ...]

    @classmethod
    def build(cls, nodes: Iterable[fx.Node], received: Mapping[fx.Node, fx.Node] | None = None) -> "StorageTable":
        """The table of ``nodes`` (in execution order); ``received[p] = q``: placeholder ``p`` is handed
        ``q``'s value (a saved value from another graph) and shares its storages."""
        received = received or {}
        sizes: list[int] = []
        maker: list[fx.Node] = []
        made: dict[fx.Node, tuple[int, ...]] = {}
        of: dict[fx.Node, tuple[int, ...]] = {}
        order = list(nodes)
        for node in order:
            if node in received:
                if received[node] in of:
                    of[node] = of[received[node]]
                continue
            if is_alias(node):
                base = node.all_input_nodes[0] if node.all_input_nodes else None
                got = of.get(base) if base is not None else None
                if got is None:
                    continue
                if node.target is operator.getitem and len(got) > 1:
                    element = _element(made.get(base), base, node.args[1])
                    got = (element,) if element is not None else got
                of[node] = got
                continue
            own = []
            for _, t in output_tensors(node.meta.get("val")):
                own.append(len(sizes))
                sizes.append(t.numel() * t.element_size())
                maker.append(node)
            made[node] = of[node] = tuple(own)
        readers: list[list[fx.Node]] = [[] for _ in sizes]
        for node in order:
            for s in dict.fromkeys(s for a in node.all_input_nodes for s in of.get(a, ())):
                readers[s].append(node)
        return cls(np.asarray(sizes, np.int64), tuple(maker), made, of, tuple(tuple(r) for r in readers))

    @functools.cached_property
    def by_name(self) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """``made`` and ``of`` keyed by node name, as a schedule names its steps (built once: the
        simulator looks up every read of every step)."""
        return {n.name: v for n, v in self.made.items()}, {n.name: v for n, v in self.of.items()}

    def reads(self, node: fx.Node) -> tuple[int, ...]:
        """The storages ``node`` reads (each once, in the order of its inputs)."""
        return tuple(dict.fromkeys(s for a in node.all_input_nodes for s in self.of.get(a, ())))

    def nbytes(self, node: fx.Node) -> int:
        """Bytes ``node`` allocates (0 for an alias)."""
        return int(self.size[list(self.made.get(node, ()))].sum())

    def counted(self, makers: Iterable[fx.Node]) -> "Counted":
        """The storages ``makers`` allocate, numbered in their order: the ones a pricing counts."""
        ids = [s for x in makers for s in self.made.get(x, ())]
        return Counted(self, {s: i for i, s in enumerate(ids)}, self.size[ids] if ids else np.zeros(0, np.int64))


@dataclass(frozen=True, eq=False)
class Counted:
    """Some makers' storages of a :class:`StorageTable`, numbered 0, 1, …; the other storages (the
    parameters', the inputs', values computed before the step) are constants to the pricing.

    Attributes:
        table: the whole table.
        local: table storage → its number here.
        size: bytes of each counted storage.
    """

    table: StorageTable
    local: Mapping[int, int]
    size: np.ndarray

    def made(self, node: fx.Node) -> list[int]:
        """The counted storages ``node`` allocates."""
        return [self.local[s] for s in self.table.made.get(node, ()) if s in self.local]

    def of(self, node: fx.Node) -> list[int]:
        """The counted storages a read of ``node`` keeps alive."""
        return [self.local[s] for s in self.table.of.get(node, ()) if s in self.local]

    def reads(self, node: fx.Node) -> list[int]:
        """The counted storages ``node`` reads."""
        return [self.local[s] for s in self.table.reads(node) if s in self.local]


def _element(own: tuple[int, ...] | None, base: fx.Node, index: object) -> int | None:
    """The storage of output ``index`` of the multi-output op ``base`` (None where that output is no
    tensor, or ``base`` is itself an alias: a read then keeps the whole value alive)."""
    if own is None:
        return None
    indices = [i for i, _ in output_tensors(base.meta.get("val"))]
    return own[indices.index(index)] if index in indices else None


def joint_table(joint: object) -> StorageTable:
    """The table of a traced step's joint graph (``recompute.capture.joint.JointProgram``), built once and kept
    on it: every schedule of the step is priced against it."""
    cache = joint.__dict__
    if "storage_table" not in cache:
        cache["storage_table"] = StorageTable.build(joint.gm.graph.nodes)
    return cache["storage_table"]
