"""The computation graph G = (V, E) of Kusumoto et al. (2019), §2.

V is the set of tensor-producing operations of one forward pass (inputs and parameters excluded),
and (v, w) ∈ E when the output of v is read by w. Each node carries the two costs of the paper:
``mem`` (M_v, bytes of its output) and ``time`` (T_v, its forward cost in integer units).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["Graph"]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _as_list(name: str, values: Any) -> list[Any]:
    """``values`` as a list; a string or a non-iterable is a ``TypeError`` naming ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence, got {type(values).__name__} {values!r}")
    return list(values)


def _int_list(name: str, values: Any) -> list[int]:
    """Per-node costs: non-negative integers (a float or a string is an error, not silently truncated)."""
    out = _as_list(name, values)
    for i, x in enumerate(out):
        if not _is_int(x):
            raise TypeError(f"{name}[{i}] = {x!r}: {name} must hold integers, one per node")
        if x < 0:
            raise ValueError(f"{name}[{i}] = {x}: {name} must be non-negative")
    return [int(x) for x in out]


@dataclass(eq=False)
class Graph:
    """A DAG over nodes ``0..n-1`` with per-node memory and time costs.

    Attributes:
        preds: ``preds[v]`` are the nodes whose outputs v reads (δ⁻({v})).
        mem: M_v in bytes, int64.
        time: T_v in integer cost units, int64 (see :mod:`recompute.capture.costs`).
        names: a readable label per node (the traced op and its source line where known).
        ops: the operator of each node (``"aten.conv2d.default"``; free text for synthetic graphs).
        outputs: the nodes whose values leave the network (the loss or the model's output).
        cost_model: which cost model produced ``time``.
        program: the executable trace behind the graph (``None`` for graphs built from edges).
        saved: bytes of each node's output that plain autograd keeps for backward (≤ ``mem``; a
            value nobody saves is only transient). Defaults to ``mem``; the ``liveness`` memory model
            of :mod:`recompute.core.lowerset` uses it.
        edge_arrays: E as two int64 arrays (tails, heads), derived from ``preds``.
    """

    preds: tuple[tuple[int, ...], ...]
    mem: np.ndarray
    time: np.ndarray
    names: tuple[str, ...]
    ops: tuple[str, ...]
    outputs: tuple[int, ...]
    cost_model: str = "given"
    program: Any = field(default=None, repr=False)
    saved: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.preds)
        self.mem = np.asarray(self.mem, dtype=np.int64)
        self.time = np.asarray(self.time, dtype=np.int64)
        self.saved = self.mem.copy() if self.saved is None else np.minimum(np.asarray(self.saved, np.int64), self.mem)
        if self.mem.shape != (n,) or self.time.shape != (n,):
            raise ValueError(f"mem and time need one entry per node ({n}); got {self.mem.shape} and {self.time.shape}")
        if (self.mem < 0).any() or (self.time < 0).any():
            raise ValueError("mem and time must be non-negative")
        if len(self.names) != n or len(self.ops) != n:
            raise ValueError(f"names and ops need one entry per node ({n}); got {len(self.names)} and {len(self.ops)}")
        bad = [v for v in self.outputs if not 0 <= v < n]
        if bad:
            raise ValueError(f"outputs {bad} name nodes outside 0..{n - 1}")
        for v, ps in enumerate(self.preds):
            for u in ps:
                if not 0 <= u < n or u == v:
                    raise ValueError(f"bad edge ({u}, {v}) in a graph of {n} nodes")
        succs: list[list[int]] = [[] for _ in range(n)]
        for v, ps in enumerate(self.preds):
            for u in ps:
                succs[u].append(v)
        self.succs: tuple[tuple[int, ...], ...] = tuple(tuple(s) for s in succs)
        edges = [(u, v) for v, ps in enumerate(self.preds) for u in ps]
        # E as two int64 arrays (tails, heads): vectorised set operations over the edges
        self.edge_arrays: tuple[np.ndarray, np.ndarray] = (
            np.array([u for u, _ in edges], dtype=np.int64), np.array([v for _, v in edges], dtype=np.int64))
        self.topo_order: tuple[int, ...] = self._topological_order()

    @classmethod
    def from_edges(
        cls,
        edges: Iterable[tuple[int, int]],
        mem: Sequence[int],
        time: Sequence[int],
        *,
        names: Sequence[str] | None = None,
        outputs: Sequence[int] | None = None,
    ) -> "Graph":
        """Build a graph over nodes ``0..len(mem)-1`` from ``(u, v)`` pairs (u's output is read by v).

        ``mem`` (bytes) and ``time`` (cost units) are non-negative integers, one per node; ``names``,
        when given, one per node; ``outputs`` defaults to the sinks (nodes without successors).
        Arguments of the wrong kind or length raise ``TypeError``/``ValueError`` naming the argument.
        """
        mem, time = _int_list("mem", mem), _int_list("time", time)
        n = len(mem)
        if len(time) != n:
            raise ValueError(f"time needs one entry per node: mem has {n}, time has {len(time)}")
        if names is not None and (isinstance(names, str) or len(names) != n):
            raise ValueError(f"names needs one label per node ({n}), got {names!r}")
        preds: list[set[int]] = [set() for _ in range(n)]
        for i, edge in enumerate(_as_list("edges", edges)):
            if isinstance(edge, (str, bytes)) or not hasattr(edge, "__len__") or len(edge) != 2 or not all(map(_is_int, edge)):
                raise TypeError(f"edges[{i}] = {edge!r}: each edge must be a pair (u, v) of node ids (ints)")
            u, v = int(edge[0]), int(edge[1])
            if not (0 <= u < n and 0 <= v < n):
                raise ValueError(f"edge ({u}, {v}) names a node outside 0..{n - 1}")
            preds[v].add(u)
        names = tuple(names) if names is not None else tuple(f"v{i}" for i in range(n))
        has_succ = {u for ps in preds for u in ps}
        outs = tuple(_int_list("outputs", outputs)) if outputs is not None else tuple(v for v in range(n) if v not in has_succ)
        return cls(
            preds=tuple(tuple(sorted(p)) for p in preds),
            mem=np.asarray(mem, dtype=np.int64),
            time=np.asarray(time, dtype=np.int64),
            names=names,
            ops=tuple("op" for _ in range(n)),
            outputs=outs,
        )

    @property
    def n(self) -> int:
        """#V."""
        return len(self.preds)

    @property
    def edges(self) -> list[tuple[int, int]]:
        """E as ``(u, v)`` pairs."""
        return list(zip(*(a.tolist() for a in self.edge_arrays)))

    @property
    def num_edges(self) -> int:
        """#E."""
        return sum(len(p) for p in self.preds)

    @property
    def nodes(self) -> frozenset[int]:
        """V."""
        return frozenset(range(self.n))

    def total_mem(self) -> int:
        """M(V): bytes of all activations of one forward pass."""
        return int(self.mem.sum())

    def total_time(self) -> int:
        """T(V): cost of one forward pass."""
        return int(self.time.sum())

    def _topological_order(self) -> tuple[int, ...]:
        # Kahn's algorithm, smallest id first, so a graph already numbered topologically keeps its order.
        import heapq

        indeg = [len(p) for p in self.preds]
        ready = [v for v in range(self.n) if indeg[v] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            v = heapq.heappop(ready)
            order.append(v)
            for w in self.succs[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, w)
        if len(order) != self.n:
            raise ValueError("the graph has a cycle; a computation graph must be a DAG")
        return tuple(order)

    def ancestors_mask(self) -> np.ndarray:
        """Boolean matrix A with A[v, w] true iff w = v or w reaches v: row v is the lower set L_v (§4.3)."""
        a = np.zeros((self.n, self.n), dtype=bool)
        for v in self.topo_order:
            a[v, v] = True
            for u in self.preds[v]:
                a[v] |= a[u]
        return a

    def __repr__(self) -> str:
        return (
            f"Graph(#V={self.n}, #E={self.num_edges}, M(V)={self.total_mem()} B, "
            f"T(V)={self.total_time()}, cost_model={self.cost_model!r})"
        )
