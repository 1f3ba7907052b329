"""A chain or join schedule of the pebble game, compiled into a :class:`recompute.pricing.schedule.Schedule`.

The pebble game's ops become op instances of the joint graph (:mod:`recompute.capture.joint`):

* ``F∅``/``Fck``/``Fall`` on step i of a branch: the step's forward fx nodes, in the traced order, as a
  new copy of each (copy 0 the first time, then 1, 2, …: recomputation), reading the latest copy of
  every input;
* ``T`` (the turn): the head's forward nodes, then the backward ops owned by the head (and any the
  engine ran outside a node of V);
* ``B`` on step i: the backward ops owned by the step's nodes, reading the latest copies.

What each op keeps is not written down: the executor frees every value after its last read, so a
``Fall`` is simply the last forward of a step before its ``B`` (whose reads keep its values), and a
``F∅`` one whose values nothing reads later. The simulator then prices the real program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.fx as fx

from recompute.core.fxnodes import is_random
from recompute.pricing.schedule import Schedule, Writer
from recompute.planners.pebble.graphmap import JoinMap
from recompute.planners.pebble.schedule import OpKind
from recompute.planners.pebble.schedule import Schedule as PebbleSchedule

if TYPE_CHECKING:
    from recompute.core.graph import Graph

__all__ = ["to_schedule"]


def to_schedule(g: "Graph", jm: JoinMap, pebbles: PebbleSchedule) -> Schedule:
    """Compile ``pebbles`` (ops on the steps of ``jm``) into an executable schedule of ``g``."""
    p = g.program
    joint = p.joint
    position = {n.name: i for i, n in enumerate(joint.forward + joint.backward)}
    forward_of = dict(enumerate(p.members))
    backward_of: dict[int | None, list[fx.Node]] = {}
    for node in joint.backward:
        backward_of.setdefault(p.owner.get(node.name), []).append(node)

    def nodes_of(vs: tuple[int, ...], table: dict) -> list[fx.Node]:
        return [n for v in vs for n in table.get(v, [])]

    out = Writer()
    emit = out.emit
    backward_start: int | None = None

    waiting: list[tuple[fx.Node, int]] = []

    def emit_backward(nodes: list[fx.Node], blk: int) -> None:
        """Emit backward ops in the traced order, each once every op it reads has run: the sum of a
        shared parameter's gradient over branches waits for the last branch's contribution."""
        waiting.extend((n, blk) for n in sorted(nodes, key=lambda n: position[n.name]))
        ready = True
        while ready:
            ready = next((w for w in waiting if all(a.name in out.latest or a.op == "placeholder"
                                                    for a in w[0].all_input_nodes)), None)
            if ready:
                waiting.remove(ready)
                emit(ready[0], ready[1], False)

    for node in p.prologue:
        emit(node, 0, False)
    for op in pebbles.ops:
        if op.kind is OpKind.TURN:
            for node in sorted(nodes_of(jm.head, forward_of), key=lambda n: position[n.name]):
                emit(node, 0, True)
            backward_start = len(out.steps)
            emit_backward([*backward_of.get(None, []), *nodes_of(jm.head, backward_of)], 0)
            continue
        step = jm.branches[op.branch][op.step - 1]
        if op.kind is OpKind.B:
            emit_backward(nodes_of(step.nodes, backward_of), op.step)
        else:
            for node in sorted(nodes_of(step.nodes, forward_of), key=lambda n: position[n.name]):
                emit(node, op.step, True)
    if backward_start is None:
        raise ValueError("the pebble schedule has no turn: nothing starts the backward pass")
    missing = {n.name for n in joint.forward + joint.backward} - {name for name, _ in out.steps} - {
        n.name for n in p.prologue}
    if missing:
        raise ValueError(f"the pebble schedule leaves {len(missing)} ops of the step out, e.g. {sorted(missing)[:3]}")
    if any(c > 0 for name, c in out.steps[:backward_start] if is_random(joint.node(name))):
        raise ValueError("a random op is recomputed before the turn; its generator state cannot be replayed there")
    return out.schedule(backward_start)
