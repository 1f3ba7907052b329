"""Small helpers on the nodes of a traced fx graph, shared by tracing, cost models and execution."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["output_tensors", "run_node"]


def output_tensors(val: Any) -> list[tuple[int | None, torch.Tensor]]:
    """The tensors an fx node produces, as (output index or None for a single tensor, tensor)."""
    if isinstance(val, torch.Tensor):
        return [(None, val)]
    if isinstance(val, (tuple, list)):
        return [(i, v) for i, v in enumerate(val) if isinstance(v, torch.Tensor)]
    return []


def run_node(node: fx.Node, env: dict[str, Any]) -> Any:
    """Run one fx node on the values in ``env`` (keyed by node name)."""
    args = fx.node.map_arg(node.args, lambda a: env[a.name])
    kwargs = fx.node.map_arg(node.kwargs, lambda a: env[a.name])
    if node.target is operator.getitem:
        return args[0][args[1]]
    return node.target(*args, **kwargs)
