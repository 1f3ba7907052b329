"""Small helpers on the nodes of a traced fx graph, shared by tracing, cost models and execution."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

__all__ = ["output_tensors", "is_random", "runs_once"]


def output_tensors(val: Any) -> list[tuple[int | None, torch.Tensor]]:
    """The tensors an fx node produces, as (output index or None for a single tensor, tensor)."""
    if isinstance(val, torch.Tensor):
        return [(None, val)]
    if isinstance(val, (tuple, list)):
        return [(i, v) for i, v in enumerate(val) if isinstance(v, torch.Tensor)]
    return []


def is_random(node: fx.Node) -> bool:
    """Whether the node draws from the random generator (dropout): recomputing it must replay the state."""
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags


def runs_once(node: fx.Node) -> bool:
    """Whether ``node`` must run exactly once per step: it draws random numbers, or it writes into its
    input (inductor's graphs write BatchNorm's statistics into the buffers with ``copy_``)."""
    target = node.target
    return is_random(node) or (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable)
