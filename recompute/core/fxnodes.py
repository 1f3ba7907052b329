"""Small helpers on the nodes of a traced fx graph, shared by tracing, cost models and execution."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx as fx

__all__ = ["output_tensors", "is_random", "runs_once", "out_overload", "written_into"]


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


@functools.cache
def out_overload(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, str | None] | None:
    """The overload that writes the pointwise functional ``op``'s output into an existing tensor, and
    the name of the argument it writes: its ``out=`` overload where that has a kernel of its own; else
    its in-place variant, which writes into its first argument (``None`` for the name), where the
    ``out=`` overload is only the generated wrapper that computes into a new tensor and copies it
    (``relu.out``: a hidden temporary of the output's size, and 10× ``relu_`` on the CPU). ``None``
    where ``op`` is no such op or has neither."""
    schema = op._schema
    if torch.Tag.pointwise not in op.tags or schema.is_mutable or len(schema.returns) != 1:
        return None
    args = [(a.name, str(a.type)) for a in schema.arguments]
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        written = [a.name for a in candidate._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        rest = [(a.name, str(a.type)) for a in candidate._schema.arguments if a.name not in written]
        if len(written) == 1 and rest == args:
            return (candidate, written[0]) if _computes_in_place(candidate) else _in_place_variant(op)
    return None


def _computes_in_place(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` has a kernel of its own on a device (not only the generated composite wrapper)."""
    return any(op.has_kernel_for_dispatch_key(key) for key in (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA))


def _in_place_variant(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, None] | None:
    """``op_`` (``relu_`` for ``relu``) with ``op``'s arguments, writing into the first, where it exists."""
    variant = getattr(getattr(torch.ops.aten, op.overloadpacket.__name__ + "_", None), op._overloadname, None)
    if variant is None or not _computes_in_place(variant):
        return None
    signature = lambda o: [(a.name, str(a.type)) for a in o._schema.arguments]  # noqa: E731
    first = variant._schema.arguments[0]
    writes_first = first.alias_info is not None and first.alias_info.is_write
    return (variant, None) if writes_first and signature(variant) == signature(op) else None


def written_into(op: torch._ops.OpOverload, kwargs: dict[str, Any], target: Any) -> tuple[torch._ops.OpOverload, dict[str, Any]]:
    """The call of ``op`` with ``kwargs`` rewritten to write its output into ``target`` (its first
    argument already, where :func:`out_overload` gives the in-place variant)."""
    rewritten, out = out_overload(op)
    return rewritten, kwargs if out is None else {**kwargs, out: target}
