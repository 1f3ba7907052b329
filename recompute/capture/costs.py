"""Cost models: T_v, the forward cost of each node of V, in integer units.

* ``paper`` — Kusumoto §3: 10 for a convolution, 1 for any other node.
* ``flops`` — floating-point operations counted by ``torch.utils.flop_counter`` on FakeTensors (no
  arithmetic); nodes without a FLOP formula (ReLU, add, BatchNorm, pooling…) cost one unit per output
  element, so that every T_v > 0 and memory-bound ops are not free.
* ``measured`` — nanoseconds: the node's calls timed by :class:`recompute.capture.timing.TimeModel` (alone on
  real tensors of their traced shapes, median of ``repeats`` calls after one warm-up) on the device
  the model was traced on (cuda for a model and inputs on cuda) or on ``device``; or priced by a given
  ``time_model`` (e.g. one extrapolated from small batches): the costs a comparison on that device plans with.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
from torch.utils.flop_counter import FlopCounterMode
from torch._subclasses.fake_tensor import FakeTensorMode

from recompute.core.fxnodes import output_tensors
from recompute.capture.timing import TimeCache, TimeModel, node_call

__all__ = ["COST_MODELS", "cost"]

_CONV = ("conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def _op_name(node: fx.Node) -> str:
    return str(node.target).split(".")[1] if str(node.target).startswith("aten.") else str(node.target)


def paper_cost(program: Any) -> np.ndarray:
    """10 per convolution, 1 otherwise (the paper's Table 1 setting)."""
    return np.array([10 if _op_name(nodes[0]) in _CONV else 1 for nodes in program.members], dtype=np.int64)


def _materialize(val: Any, make: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(val, torch.Tensor):
        return make(val)
    if isinstance(val, (list, tuple)):
        return type(val)(_materialize(v, make) for v in val)
    return val


def _call_args(node: fx.Node, make: Callable[[torch.Tensor], torch.Tensor]) -> tuple[tuple, dict]:
    """The node's arguments with every fx input replaced by a fresh tensor of its traced shape."""
    conv = lambda a: _materialize(a.meta["val"], make) if isinstance(a, fx.Node) else a  # noqa: E731
    return fx.node.map_aggregate(node.args, conv), fx.node.map_aggregate(node.kwargs, conv)


def flops_cost(program: Any) -> np.ndarray:
    """FLOPs per node from ``torch.utils.flop_counter`` under FakeTensorMode; ≥ #output elements."""
    out = []
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        make = lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)  # noqa: E731
        for nodes in program.members:
            op = nodes[0]
            args, kwargs = _call_args(op, make)
            counter = FlopCounterMode(display=False)
            with counter:
                op.target(*args, **kwargs)
            out.append(max(counter.get_total_flops(), sum(t.numel() for _, t in output_tensors(op.meta.get("val"))), 1))
    del mode
    return np.asarray(out, dtype=np.int64)


def _traced_device(program: Any) -> torch.device:
    """The device of the traced values (FakeTensors keep the device of what they stand for)."""
    for nodes in program.members:
        for _, t in output_tensors(nodes[0].meta.get("val")):
            return t.device
    return torch.device("cpu")


def measured_cost(program: Any, *, device: str | torch.device | None = None, repeats: int = 3,
                  time_model: Any = None) -> np.ndarray:
    """Each node's forward time in nanoseconds: the predicted seconds of its members' calls under
    ``time_model`` (a :class:`~recompute.capture.timing.TimeModel`, or a
    :class:`~recompute.capture.timing.BatchExtrapolation` that knows the program's calls), or, where none is
    given, timed alone on real tensors on ``device`` (``None``: the device the graph was traced on, so a
    run is planned with its own device's times), the median of ``repeats`` calls. A planner given the
    time model a comparison is judged by minimises the very seconds it reports. Each op's seconds are
    kept on the program (``op_seconds``): the price of recomputing it alone (:mod:`recompute.rewrites.remat`), and
    the time model too (``time_model``), which prices the backward's ops and whole schedules
    (:func:`recompute.pricing.steptime.step_time`). Timed here, the keys go to the device's
    :meth:`~recompute.capture.timing.TimeCache.default` cache, and keys timed by an earlier process are read from it."""
    if time_model is None:
        where = torch.device(device) if device is not None else _traced_device(program)
        time_model = TimeModel(where, repeats=repeats, cache=TimeCache.default(where))
    named = [[(n.name, c) for n in nodes if (c := node_call(n)) is not None] for nodes in program.members]
    seconds = time_model.costs([c for group in named for _, c in group])
    program.op_seconds = dict(zip((name for group in named for name, _ in group), seconds))
    program.time_model = time_model
    out = [max(1, round(sum(program.op_seconds[name] for name, _ in group) * 1e9)) for group in named]
    return np.asarray(out, dtype=np.int64)


COST_MODELS: dict[str, Callable[..., np.ndarray]] = {
    "paper": paper_cost,
    "flops": flops_cost,
    "measured": measured_cost,
}


def cost(name: str, program: Any, **options: Any) -> np.ndarray:
    """T_v for every node of ``program`` under the cost model ``name``."""
    if name not in COST_MODELS:
        raise ValueError(f"unknown cost_model {name!r}; choose one of {', '.join(COST_MODELS)}")
    return COST_MODELS[name](program, **options)
