"""Whether a training step equals plain training: loss, parameter gradients and buffers (BatchNorm
statistics) after one step from the same generator state, compared bitwise and within ``assert_close``."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recompute.doors.measure import default_loss

__all__ = ["Exactness", "train_step", "compare", "judge", "float64_distance"]


def train_step(model: torch.nn.Module, forward: Callable[..., Any], inputs: tuple, seed: int,
               loss_fn: Callable[[Any], torch.Tensor] = default_loss) -> dict[str, Any]:
    """Loss, parameter gradients, the gradients of the inputs that require grad (``grad:input<i>``) and
    buffers (BatchNorm statistics) after one step from ``seed``.

    The gradients are the model's own tensors, not copies: a further step must start from
    ``model.zero_grad(set_to_none=True)``, or it accumulates into them. Inputs' gradients start from
    None here.
    """
    for x in inputs:
        if x.requires_grad and x.is_leaf:
            x.grad = None
    torch.manual_seed(seed)
    loss = loss_fn(forward(*inputs))
    loss.backward()
    return {
        "loss": loss.detach(),
        "rng": torch.get_rng_state(),
        **{f"grad:{n}": p.grad for n, p in model.named_parameters() if p.grad is not None},
        **{f"grad:input{i}": x.grad for i, x in enumerate(inputs) if x.is_leaf and x.grad is not None},
        **{f"buffer:{n}": b.clone() for n, b in model.named_buffers()},
    }


@dataclass
class Exactness:
    """How one step of a method compares with plain training.

    Attributes:
        unequal: entries (``loss``, ``grad:<name>``, ``buffer:<name>``, ``rng``) not bitwise equal.
        differs: those of them outside ``assert_close``'s default tolerance for their dtype.
    """

    unequal: list[str] = field(default_factory=list)
    differs: list[str] = field(default_factory=list)

    @property
    def bitwise(self) -> bool:
        return not self.unequal

    def summary(self) -> str:
        """``bitwise``, ``close`` (within assert_close) or ``differs: loss, 3 grads, 4 buffers``."""
        if self.bitwise:
            return "bitwise"
        if not self.differs:
            return "close"
        kinds = {"grad": 0, "buffer": 0}
        named = [k for k in self.differs if ":" not in k]
        for k in self.differs:
            if ":" in k:
                kinds[k.split(":")[0]] += 1
        return "differs: " + ", ".join([*named, *(f"{n} {k}s" for k, n in kinds.items() if n)])


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a, b)
    except AssertionError:
        return False
    return True


def compare(model: torch.nn.Module, forward: Callable[..., Any], inputs: tuple, *, seed: int = 0,
            loss_fn: Callable[[Any], torch.Tensor] = default_loss) -> Exactness:
    """One step of ``model`` and one of ``forward`` (a method wrapping it: an executor, a baseline) from
    the same buffers and generator state; the model's buffers, gradients and the global generator are
    left as they were. An executor traced with the loss (``includes_loss``) returns the loss itself."""
    start = {n: b.clone() for n, b in model.named_buffers()}
    grads = {n: p.grad for n, p in model.named_parameters()}

    def step(f: Callable[..., Any]) -> dict[str, Any]:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(start[n])
        return train_step(model, f, inputs, seed, (lambda out: out) if getattr(f, "includes_loss", False) else loss_fn)

    devices = sorted({x.device.index or 0 for x in inputs if x.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        ref = step(model)
        got = step(forward)
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(start[n])
    for n, p in model.named_parameters():
        p.grad = grads[n]
    return judge(ref, got)


def judge(ref: dict[str, Any], got: dict[str, Any]) -> Exactness:
    """How the step ``got`` (:func:`train_step`'s entries) compares with the plain step ``ref``."""
    result = Exactness()
    for key in sorted(ref.keys() | got.keys()):
        a, b = ref.get(key), got.get(key)
        if a is None or b is None or a.shape != b.shape or not torch.equal(a, b):
            result.unequal.append(key)
            if a is None or b is None or a.shape != b.shape or key == "rng" or not _close(b, a):
                result.differs.append(key)
    return result


def _distance(got: dict[str, Any], ref: dict[str, Any]) -> float:
    """The largest relative distance ``‖got − ref‖ / ‖ref‖`` of any entry (loss, gradient, floating
    buffer) from ``ref``'s.

    The denominator has a floor: float32's unit roundoff times the norm of all entries of the same
    kind (every gradient together; every buffer together). An entry whose true value is ~0 — a bias
    before BatchNorm, a gradient that BatchNorm over two 1×1 maps makes vanish, |ref| ~ 1e-14 — is
    computed in float32 only to that resolution, eager's step and ours alike; measured against its own
    size, rounding noise reads as 1e9.
    """
    def kind(key: str) -> str:
        return key.partition(":")[0]

    floating = {k: r.double() for k, r in ref.items() if k != "rng" and r.is_floating_point()}
    scale: dict[str, float] = {}
    for key, r in floating.items():
        scale[kind(key)] = scale.get(kind(key), 0.0) + float(r.norm()) ** 2
    floor = {k: torch.finfo(torch.float32).eps * v ** 0.5 for k, v in scale.items()}
    worst = 0.0
    for key, r in floating.items():
        a = got[key].double()
        worst = max(worst, float((a - r).norm()) / max(float(r.norm()), floor[kind(key)], 1e-30))
    return worst


def float64_distance(model: torch.nn.Module, forward: Callable[..., Any], inputs: tuple, *, seed: int = 0,
                     loss_fn: Callable[[Any], torch.Tensor] = default_loss) -> tuple[float, float]:
    """How far a step of ``forward`` and a plain float32 step of ``model`` land from the float64 step
    (each: the largest relative distance of the loss, a gradient or a buffer): the yardstick where a
    plan runs other kernels than eager (a decomposed LSTM), so bitwise equality cannot hold.

    ``model`` and ``inputs`` are float32; the float64 step runs on a copy. The model is left as it was.
    """
    twin = copy.deepcopy(model).double()
    # leaves again (``x.double()`` of a leaf is not one): the float64 step's input gradients are compared too
    wide = tuple(x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x for x in inputs)
    devices = sorted({x.device.index or 0 for x in inputs if x.device.type == "cuda"})
    start = {n: b.clone() for n, b in model.named_buffers()}
    steps = []
    with torch.random.fork_rng(devices=devices):
        for m, f, xs in ((twin, twin, wide), (model, model, inputs), (model, forward, inputs)):
            m.zero_grad(set_to_none=True)
            with torch.no_grad():
                for n, b in m.named_buffers():
                    b.copy_(start[n])
            steps.append({k: v.detach().clone() for k, v in train_step(m, f, xs, seed, loss_fn).items()})
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(start[n])
    ref, eager, ours = steps
    return _distance(ours, ref), _distance(eager, ref)
