"""Run one training step plainly and under a plan, and compare everything training touches."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch
import torch._dynamo

import recompute
from recompute.doors.exactness import train_step


def assert_same(ref: dict[str, Any], got: dict[str, Any], tol: float = 1e-12) -> None:
    assert ref.keys() == got.keys(), set(ref) ^ set(got)
    for key in ref:
        if isinstance(ref[key], bytes):  # a digest: bitwise only
            assert _digest(got[key]) == ref[key], f"{key}: not bitwise equal to plain training"
        else:
            torch.testing.assert_close(got[key], ref[key], rtol=tol, atol=tol, msg=lambda m: f"{key}: {m}")


# odd 64-bit weights, one per 8-byte word of a chunk: a change of the words by d ≠ 0 moves the weighted
# sum (mod 2^64) by d·w ≠ 0, and changes cancel only by chance (2^-64); hashing VGG-19's 575 MB of
# gradients with blake2b was 11 of a zoo test's 35 profiled seconds, this sum takes 0.14 s per 575 MB
_CHUNK = 1 << 20
_WEIGHTS = np.random.default_rng(0).integers(0, 2**63, size=_CHUNK, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _digest(t: torch.Tensor) -> bytes:
    """Shape, dtype and a weighted sum of the bytes of ``t``: equal for equal tensors, unequal (but by
    a 2^-64 chance) for tensors that differ in any bit."""
    raw = t.detach().reshape(-1).contiguous().view(torch.uint8).numpy()
    words = raw[: raw.size // 8 * 8].view(np.uint64)
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, words.size, _CHUNK):
            part = words[start:start + _CHUNK]
            total += (part * _WEIGHTS[:part.size]).sum(dtype=np.uint64)
    tail = raw[words.size * 8:].tobytes()
    return f"{tuple(t.shape)} {t.dtype} {int(total)} {tail!r}".encode()


MakePlan = Callable[[recompute.Graph], recompute.Plan]


def check_plans(model: torch.nn.Module, inputs: tuple, makers: list[MakePlan], seed: int = 0,
                dtype: torch.dtype = torch.float64, graph: recompute.Graph | None = None) -> list[recompute.Plan]:
    """Assert that each plan's training step equals plain training; return the plans.

    In float64 the comparison allows 1e-12; in float32 (for the large zoo networks, to halve their
    memory) it is bitwise: the same kernels run on the same values, and plain training's gradients are
    kept as digests (on VGG19 a copy would be 575 MB more per test process). A plan whose schedule
    equals one checked before is not run again. ``graph``: the model's trace in
    ``dtype``, when the caller has it (traced here otherwise).

    Every step runs on ``model`` itself from its buffers as given and no gradients (a step changes
    nothing else), and it is left so: no copy of the parameters, which on VGG19 are 575 MB.
    """
    model = model.to(dtype).train()
    inputs = tuple(x.to(dtype) for x in inputs)
    tol = 1e-12 if dtype == torch.float64 else 0.0
    if graph is None:
        graph = recompute.trace(model, inputs)
    start = {name: b.clone() for name, b in model.named_buffers()}

    def reset() -> None:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(start[name])

    def step(forward: Callable[..., Any]) -> dict[str, Any]:
        reset()
        return train_step(model, forward, inputs, seed)

    ref = step(model)
    if tol == 0.0:
        ref = {key: _digest(value) for key, value in ref.items()}
    plans, checked = [], set()
    for make in makers:
        plan = make(graph)
        program = (tuple(plan.lower_sets), None if plan.schedule is None else id(plan.schedule))
        if program not in checked:
            assert_same(ref, step(recompute.execute(graph, plan, model)), tol)
            checked.add(program)
        plans.append(plan)
    reset()
    return plans


def check_plan(model: torch.nn.Module, inputs: tuple, make_plan: MakePlan, seed: int = 0) -> recompute.Plan:
    """:func:`check_plans` for one plan."""
    return check_plans(model, inputs, [make_plan], seed)[0]


def sgd_steps(model: torch.nn.Module, forward: Callable[..., Any], inputs: tuple, steps: int = 2) -> list[dict[str, Any]]:
    """``steps`` SGD steps of ``model`` through ``forward`` (momentum, so that a wrong gradient or
    statistic shows in the next step): each step's loss, gradients and BatchNorm statistics."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        out.append({k: v.clone() for k, v in train_step(model, forward, inputs, seed=step).items()})
        opt.step()
    return out


def compiled_like_plain(model: torch.nn.Module, inputs: tuple,
                        backends: dict[Any, "recompute.doors.backend.Backend"]) -> dict[Any, "recompute.doors.backend.Partition"]:
    """Train a copy of ``model`` plainly and one compiled with each of ``backends`` (:func:`sgd_steps`);
    assert every compiled run bitwise equal to the plain one and return each backend's last
    partition, by its key."""
    reference = copy.deepcopy(model)
    plain = sgd_steps(reference, reference, inputs)
    parts = {}
    for key, backend in backends.items():
        torch._dynamo.reset()
        compiled = copy.deepcopy(model)
        got = sgd_steps(compiled, torch.compile(compiled, backend=backend), inputs)
        for step, (a, b) in enumerate(zip(plain, got)):
            assert a.keys() == b.keys()
            for name in a:
                assert torch.equal(a[name], b[name]), f"{key}, step {step}: {name}"
        parts[key] = backend.partitions[-1]
    return parts
