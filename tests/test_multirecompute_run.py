"""Schedules that recompute more than once (Revolve, Beaumont's join DP) run on the executor: exact
training, and the simulator's peak is the measured one."""

from __future__ import annotations

import copy

import pytest
import torch

import recompute
from experiments import nets
from recompute.doors.measure import default_loss, measure
from recompute.planners.pebble import c_min, c_opt, chain_of, join_dp, join_of, revolve
from recompute.planners.pebble.compile import to_schedule
from recompute.pricing.simulate import simulate

from .exactness import assert_same, train_step


def _run(model, inputs, graph, schedule):
    return recompute.execute(graph, recompute.plan(graph, "vanilla"), model, schedule=schedule)


def _check(name: str, build: dict, mapping, planner, slot_counts) -> None:
    model, inputs = nets.build(name, **build)
    model, inputs = model.double(), tuple(x.double() for x in inputs)
    plain = copy.deepcopy(model)
    ref = train_step(plain, plain, inputs, 0)
    graph = recompute.trace(model, inputs, loss_fn=default_loss, workspaces=False)
    jm = mapping(graph)
    vanilla = recompute.plan(graph, "vanilla").peak
    peaks = []
    for slots in slot_counts(jm.lengths):
        s = to_schedule(graph, jm, planner(jm.lengths, slots))
        planned = copy.deepcopy(model)
        # traced with the loss: the executor returns it, so the step's "forward" is the identity
        got = train_step(planned, _run(planned, inputs, graph, s), inputs, 0, loss_fn=lambda loss: loss)
        assert s.recomputations() > 0
        assert_same(ref, got)
        peak = simulate(graph.program, s).peak
        assert peak == measure(planned, inputs, runner=_run(planned, inputs, graph, s), backend="fake").peak_bytes
        peaks.append(peak)
    assert peaks[0] < vanilla, "the fewest slots should save memory"


def test_revolve_on_a_chain_network():
    _check("chain", {}, chain_of, lambda lengths, c: revolve(lengths[0], c), lambda lengths: (3, 5))


def test_join_dp_on_the_cross_modal_network():
    _check("cross_modal", {"L": 1, "width": 4}, join_of, join_dp,
           lambda lengths: (c_min(lengths), (c_min(lengths) + c_opt(lengths)) // 2))


def test_a_module_registered_twice_is_refused_with_a_clear_error():
    layer = torch.nn.Linear(4, 4)
    twice = torch.nn.Sequential(layer, torch.nn.ReLU(), layer)  # one layer registered under two names
    with pytest.raises(recompute.TraceError, match=r"registers one module under several names \(2\).*call it several times"):
        recompute.trace(twice, (torch.randn(2, 4),))
