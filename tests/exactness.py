"""Run one training step plainly and under a plan, and compare everything training touches."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

import recompute
from recompute.measure import default_loss


def train_step(model: torch.nn.Module, forward: Callable[..., Any], inputs: tuple, seed: int) -> dict[str, Any]:
    """Loss, parameter gradients and buffers (BatchNorm statistics) after one step from ``seed``."""
    torch.manual_seed(seed)
    loss = default_loss(forward(*inputs))
    loss.backward()
    return {
        "loss": loss.detach(),
        "rng": torch.get_rng_state(),
        **{f"grad:{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        **{f"buffer:{n}": b.clone() for n, b in model.named_buffers()},
    }


def assert_same(ref: dict[str, Any], got: dict[str, Any]) -> None:
    assert ref.keys() == got.keys(), set(ref) ^ set(got)
    for key in ref:
        # float64 and the same kernels on the same values: equal up to the last bit in practice
        torch.testing.assert_close(got[key], ref[key], rtol=1e-12, atol=1e-12, msg=lambda m: f"{key}: {m}")


MakePlan = Callable[[recompute.Graph], recompute.Plan]


def check_plans(model: torch.nn.Module, inputs: tuple, makers: list[MakePlan], seed: int = 0) -> list[recompute.Plan]:
    """Assert that each plan's training step equals plain training (float64); return the plans."""
    model = model.double().train()
    inputs = tuple(x.double() for x in inputs)
    plain = copy.deepcopy(model)
    ref = train_step(plain, plain, inputs, seed)
    del plain
    graph = recompute.trace(model, inputs)
    plans = []
    for make in makers:
        plan = make(graph)
        planned = copy.deepcopy(model)
        assert_same(ref, train_step(planned, recompute.execute(graph, plan, planned), inputs, seed))
        plans.append(plan)
    return plans


def check_plan(model: torch.nn.Module, inputs: tuple, make_plan: MakePlan, seed: int = 0) -> recompute.Plan:
    """:func:`check_plans` for one plan."""
    return check_plans(model, inputs, [make_plan], seed)[0]
