"""A traced network as a chain or a join of steps, so that chain and join schedules apply to it.

Mapping (Chen et al. 2016, §4.4: a segment is one bulk operator):

* **steps** are the links between consecutive *cut nodes* of a branch: nodes v with ∂(L_v) = {v}
  (:func:`recompute.core.lowerset.split_candidates`, plus the sources) whose lower sets nest, L_{v_1} ⊂ L_{v_2} ⊂ ….
  Step i runs the nodes L_{v_i} \\ L_{v_{i-1}} and its value x_i is v_i's output; the last step ends at
  the branch's output. Cut nodes whose lower sets do not nest with the earlier ones are skipped, so
  every x_i alone separates its step from the rest.
* **chain** (:func:`chain_of`): one branch over all of V, ending at the network's single output; the
  turn only seeds that output's gradient (cost 0).
* **join** (:func:`join_of`): a node belongs to branch b when only input b reaches it (inputs are told
  apart through the traced program; without one each source is an input); the nodes that two or more
  inputs reach are the *head*, which the turn runs forward and backward. Each branch must feed the head
  through one node, its x_ℓ (Beaumont et al. 2020, Definition 2.3).
* **sizes and costs** (:class:`~.schedule.Profile`): x_0 = 0 bytes (inputs are not in V and stay
  resident), x_i = M of the cut node (δ_i the same), tape_i = the bytes autograd saves inside step i
  besides x_i, uf_i = Σ T_v over the step, ub_i = ``backward_ratio``·uf_i (T_v prices forwards only;
  the default 2 is the usual rule that a backward costs two forwards), and ``rebuild`` on: a B_i
  without its tape re-runs step i. The turn of a join costs (1 + ``backward_ratio``)·T(head) and holds
  the head's saved bytes.

A schedule of ``JoinMap.lengths`` thus compiles op by op: ``F·[b]i`` runs ``branches[b][i-1].nodes``
forward from x_{i-1} (without autograd unless ``Fall``), ``T`` runs ``head`` with autograd and
back-propagates it, ``B[b]i`` back-propagates step i from x_{i-1} and δ_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

from recompute.core.graph import Graph
from recompute.core.lowerset import split_candidates
from recompute.planners.pebble.schedule import BranchProfile, Profile

if TYPE_CHECKING:
    import torch.fx as fx

__all__ = ["Step", "JoinMap", "chain_of", "join_of"]


@dataclass(frozen=True)
class Step:
    """One step: the nodes of V it runs (topological order) and the node whose output is its x_i."""

    nodes: tuple[int, ...]
    output: int


@dataclass(frozen=True)
class JoinMap:
    """A graph seen as a join (one branch: a chain) of steps.

    Attributes:
        branches: per branch, its steps 1..ℓ_b.
        head: the nodes the turn runs (empty for a chain).
        profile: per-step sizes and costs for :func:`~.schedule.simulate`.
    """

    branches: tuple[tuple[Step, ...], ...]
    head: tuple[int, ...]
    profile: Profile

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(len(b) for b in self.branches)


def _subgraph(g: Graph, nodes: list[int]) -> Graph:
    """The induced sub-graph on ``nodes`` (topological order), renumbered 0..len-1."""
    pos = {v: i for i, v in enumerate(nodes)}
    preds = tuple(tuple(pos[u] for u in g.preds[v] if u in pos) for v in nodes)
    return Graph(preds, g.mem[nodes], g.time[nodes], tuple(g.names[v] for v in nodes),
                 tuple(g.ops[v] for v in nodes), outputs=(), saved=g.saved[nodes])


def _steps(g: Graph, nodes: Iterable[int], output: int) -> tuple[Step, ...]:
    """Cut the sub-graph on ``nodes`` (whose sink is ``output``) into steps at nested cut nodes."""
    keep = set(nodes)
    order = [v for v in g.topo_order if v in keep]
    sub = _subgraph(g, order)
    lower = sub.ancestors_mask()
    # split_candidates leaves sources out (a Chen segment must not end at the first op); here a source
    # that feeds something is a fine first cut: the branch input x_0 is outside V.
    sizes = lower.sum(axis=1)
    cuts = sorted(split_candidates(sub) + [v for v in range(sub.n) if not sub.preds[v] and sub.succs[v]],
                  key=lambda v: (sizes[v], v))
    kept: list[int] = []
    for v in cuts:
        if not kept or (lower[v] >= lower[kept[-1]]).all():
            kept.append(v)
    steps, done = [], np.zeros(sub.n, dtype=bool)
    for v in kept:
        steps.append(Step(tuple(order[u] for u in np.flatnonzero(lower[v] & ~done)), order[v]))
        done |= lower[v]
    steps.append(Step(tuple(order[u] for u in np.flatnonzero(~done)), output))
    return tuple(steps)


def _branch_profile(g: Graph, steps: tuple[Step, ...], backward_ratio: float) -> BranchProfile:
    uf = np.array([g.time[list(s.nodes)].sum() for s in steps], dtype=float)
    tape = np.array([g.saved[[v for v in s.nodes if v != s.output]].sum() for s in steps], dtype=np.int64)
    x = np.array([0] + [g.mem[s.output] for s in steps], dtype=np.int64)
    return BranchProfile(uf, backward_ratio * uf, x, tape)


# where a graph is not the shape a chain or join planner takes
_ANY_GRAPH = "approxdp, exactdp, chen or milp plan any graph (recompute.optimize(model, method=...))."


def chain_of(g: Graph, *, backward_ratio: float = 2.0) -> JoinMap:
    """``g`` as one chain of steps between its nested cut nodes (see the module docstring)."""
    if len(g.outputs) != 1:
        raise ValueError(f"a chain ends at one output; this graph has {len(g.outputs)}. What to do: {_ANY_GRAPH}")
    steps = _steps(g, range(g.n), g.outputs[0])
    return JoinMap((steps,), (), Profile((_branch_profile(g, steps, backward_ratio),), ut=0.0, rebuild=True))


def _input_masks(g: Graph) -> tuple[np.ndarray, int]:
    """Per node, the bit set of the network inputs reaching it, and how many inputs there are."""
    own = np.zeros(g.n, dtype=np.int64)
    prog = g.program
    if prog is not None:
        bit = {name: 1 << i for i, name in enumerate(prog.user_inputs)}
        fx_inputs: dict[str, int] = {}

        def reads(node: fx.Node) -> int:  # inputs an fx node reads directly or through nodes outside V
            if node.name in bit:
                return bit[node.name]
            if node.name in prog.group:
                return 0
            if node.name not in fx_inputs:
                fx_inputs[node.name] = 0
                fx_inputs[node.name] = int(np.bitwise_or.reduce([0] + [reads(a) for a in node.all_input_nodes]))
            return fx_inputs[node.name]

        for v, members in enumerate(prog.members):
            own[v] = np.bitwise_or.reduce([0] + [reads(a) for n in members for a in n.all_input_nodes])
        count = len(bit)
    else:
        sources = [v for v in range(g.n) if not g.preds[v]]
        own[sources] = [1 << i for i in range(len(sources))]
        count = len(sources)
    mask = own.copy()
    for v in g.topo_order:
        for u in g.preds[v]:
            mask[v] |= mask[u]
    return mask, count


def join_of(g: Graph, *, backward_ratio: float = 2.0) -> JoinMap:
    """``g`` as a join: one branch per network input up to the head that several inputs reach."""
    mask, k = _input_masks(g)
    if k < 2:
        raise ValueError(f"a join has one branch per input and needs at least two inputs; this graph has {k}. What to do: "
                         f"revolve or chen_recursive plan a chain; {_ANY_GRAPH}")
    head = [v for v in g.topo_order if bin(int(mask[v])).count("1") >= 2]
    if not head:
        raise ValueError(f"no node reads two inputs: the branches never join. What to do: {_ANY_GRAPH}")
    in_head = np.zeros(g.n, dtype=bool)
    in_head[head] = True
    branches, profiles = [], []
    for b in range(k):
        nodes = [v for v in g.topo_order if mask[v] == 1 << b]
        feeds = [v for v in nodes if any(in_head[w] for w in g.succs[v])]
        leaks = [v for v in nodes if v in g.outputs]
        if len(feeds) != 1 or leaks:
            raise ValueError(f"branch {b} must reach the head through exactly one node and return nothing itself; "
                             f"it feeds it from {len(feeds)} nodes and returns {len(leaks)} outputs. What to do: {_ANY_GRAPH}")
        steps = _steps(g, nodes, feeds[0])
        branches.append(steps)
        profiles.append(_branch_profile(g, steps, backward_ratio))
    profile = Profile(tuple(profiles), ut=(1 + backward_ratio) * float(g.time[head].sum()),
                      turn_bytes=int(g.saved[head].sum()), rebuild=True)
    return JoinMap(tuple(branches), tuple(head), profile)
