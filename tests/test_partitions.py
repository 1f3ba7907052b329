"""PyTorch's min-cut partition and ours, priced by the pair simulator, against a real CPU step; the
time model's sums."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._functorch.partitioners import min_cut_rematerialization_partition

import recompute
from experiments import nets
from recompute.doors.measure import MemoryMeter
from benchmarks.partitions import capture, our_partition, split_convolutions, split_plan, torch_partition
from recompute.pricing.simulate import simulate_partition
from recompute.capture.timing import BatchExtrapolation, Recorder, TimeModel, module_calls


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _measured_peak(step, model: torch.nn.Module, inputs: tuple) -> int:
    """The live-storage peak of one real step (after a warm-up step), parameters and inputs excluded."""
    step(*inputs).backward()
    model.zero_grad(set_to_none=True)
    meter = MemoryMeter()
    meter.exclude([*model.parameters(), *model.buffers(), *inputs])
    with meter:
        step(*inputs).backward()
    model.zero_grad(set_to_none=True)
    return meter.peak


@pytest.mark.parametrize("budget", [0.3, 1.0])
def test_torch_partition_priced_equals_measured_step(budget):
    """The simulated peak of the min-cut partition's two modules is the real step's, within 2%; and
    partitioning the captured joint graph again gives the same modules' peak."""
    model, inputs = nets.build("resblock", batch_size=4, input_size=16, seed=0)
    partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
    with torch._functorch.config.patch(activation_memory_budget=budget):
        c = capture(model, inputs, partition_fn=partition)
        measured = _measured_peak(c.compiled, model, inputs)
    simulated = simulate_partition(c.forward, c.backward).peak
    assert abs(simulated - measured) <= 0.02 * measured
    assert simulate_partition(*torch_partition(c, budget)).peak == simulated


def test_min_cuts_remembered_across_the_grid_give_torchs_partitions():
    """torch_partition remembers torch's min-cuts on the capture: over a budget × solver grid, each
    partition is the one a capture with nothing remembered gives."""
    model, inputs = nets.build("resblock", batch_size=2, input_size=16, seed=0)
    c = capture(model.to("meta"), [torch.empty(x.shape, device="meta") for x in inputs])
    grid = [(b, solver) for b in (0.1, 0.5, 1.0) for solver in ("dp", "greedy")]
    remembered = [torch_partition(c, b, solver) for b, solver in grid]
    # three cuts shared by every budget below 1, and one per budget's knapsack answer
    assert len(c.min_cuts) == 5
    assert len({fw.code for fw, _ in remembered}) > 1
    for (b, solver), (fw, bw) in zip(grid, remembered):
        c.min_cuts.clear()
        alone = torch_partition(c, b, solver)
        assert (fw.code, bw.code) == (alone[0].code, alone[1].code), (b, solver)


def test_our_partition_priced_equals_measured_step():
    """The same for ``recompute.backend``'s partition, run by the compiled step and made again from the
    captured joint graph."""
    model, inputs = nets.build("resblock", batch_size=4, input_size=16, seed=0)
    c = capture(model, inputs, partition_fn=recompute.backend("approxdp", strategy="tc").partition)
    measured = _measured_peak(c.compiled, model, inputs)
    simulated = simulate_partition(c.forward, c.backward).peak
    assert abs(simulated - measured) <= 0.02 * measured
    fw, bw, _ = our_partition(c, "approxdp", strategy="tc")
    assert simulate_partition(fw, bw).peak == simulated


def test_convolutions_split_from_a_split_plan_are_what_split_plan_makes_with_them():
    """``split_convolutions`` of a plan's split is ``split_plan(..., split_convolutions=True)``: the same
    backward code and peak, and the split it started from unchanged."""
    model, inputs = nets.build("skip", seed=0)
    c = capture(model.to("meta"), [torch.empty(x.shape, device="meta") for x in inputs])
    _, _, part = our_partition(c, "approxdp", strategy="tc")
    base = split_plan(c, part.graph, part.plan, 0.0)
    code, peak = base.backward.code, base.peak
    split = split_convolutions(c, base)
    made = split_plan(c, part.graph, part.plan, 0.0, split_convolutions=True)
    assert split.backward.code == made.backward.code and split.peak == made.peak
    assert split.peak < peak  # convolution backwards were split, freeing their inputs earlier
    assert (base.backward.code, base.peak) == (code, peak)


def test_time_model_sum_is_the_per_op_costs():
    """A module's predicted seconds are the sum of its ops' costs; each key is timed once."""
    model, inputs = nets.build("chain", batch_size=2, input_size=8, seed=0)
    c = capture(model, inputs)
    calls = [*module_calls(c.forward), *module_calls(c.backward)]
    tm = TimeModel(repeats=2, clock="thread")
    costs = tm.costs(calls)
    assert tm.seconds(calls) == pytest.approx(sum(costs))
    assert len(tm.table) == len({call.key for call in calls}) < len(calls)  # the chain's layers share keys
    assert costs == [tm.table[call.key] for call in calls]


def test_ops_timed_in_a_plain_step_price_a_recomputing_plan_as_that_step_runs_them(monkeypatch):
    """``TimeModel.observe``: every ATen call of the plain step is timed where it runs; a key costs the
    median over the steps of its mean call in a step, and a plan that recomputes is priced by those
    costs, only its calls the step does not make (``getitem``) timed alone. Made-up clock: every call
    of step k takes k + 1 ticks, a call timed afterwards alone 3."""
    from recompute.capture import timing
    from recompute.doors.measure import default_loss
    from recompute.capture.timing import schedule_calls

    now, tick = [0.0], [0.0]

    def clock() -> float:
        now[0] += tick[0]  # read before and after a call: it took ``tick``
        return now[0]

    monkeypatch.setitem(timing.CLOCKS, "made-up", clock)
    model, inputs = nets.build("chain", batch_size=2, input_size=8, seed=0)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    plain = recompute.execute(graph, recompute.plan(graph, "vanilla"), model)
    steps = iter(range(3))

    def step() -> None:
        tick[0] = next(steps) + 1.0
        plain(*inputs).backward()
        model.zero_grad(set_to_none=True)

    tm = TimeModel(repeats=1, clock="made-up")
    tm.observe(step, steps=3)
    chen = recompute.plan(graph, "chen")
    calls = schedule_calls(graph.program, chen.runs(graph))
    aten = [c for c in calls if str(c.target).startswith("aten.")]
    assert len(calls) > len(aten) and {c.key for c in aten} <= tm.observed
    assert all(tm.table[k] == pytest.approx(2.0) for k in tm.observed)
    assert tm.seconds(calls) == pytest.approx(2.0 * len(aten) + 3.0 * (len(calls) - len(aten)))
    with pytest.raises(ValueError, match="steps"):
        tm.observe(step, steps=0)


def test_a_step_recorded_on_meta_tensors_as_the_cpus_has_the_keys_of_the_same_ops_on_the_cpu():
    """``Recorder(device="cpu")``: an eager step on ``meta`` tensors (how the head-to-head prices
    PyTorch's eager methods) is keyed as the CPU's, so one timing prices it and the traced steps."""
    def calls(device: str, as_device: str | None) -> list:
        conv = torch.nn.Conv2d(3, 4, 3).to(device)
        with Recorder(device=as_device) as recorder:
            conv(torch.ones(2, 3, 8, 8, device=device, requires_grad=True)).sum().backward()
        return [c.key for c in recorder.calls]

    cpu = calls("cpu", None)
    assert calls("meta", "cpu") == cpu != calls("meta", None)


def test_ops_are_timed_on_real_tensors_inside_a_partitioners_fake_mode(monkeypatch):
    """Planning in measured seconds runs under AOTAutograd's FakeTensorMode; the ops it times there
    must run on real tensors, or the time model holds what propagating shapes costs."""
    from recompute.capture import timing

    made = []
    make = timing.TensorSpec.make
    monkeypatch.setattr(timing.TensorSpec, "make", lambda self, device: made.append(make(self, device)) or made[-1])
    model, inputs = nets.build("chain", batch_size=2, input_size=8, seed=0, fake_inputs=True)
    c = capture(model.to("meta"), [torch.empty(x.shape, device="meta") for x in inputs])
    tm = TimeModel(repeats=1, clock="thread")
    our_partition(c, "vanilla", cost_model="measured", cost_options={"time_model": tm})
    assert made and len(tm.table) > 0
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in made), {type(t).__name__ for t in made}


class _CountingLock:
    def __init__(self):
        self.held, self.entered = False, 0

    def __enter__(self):
        assert not self.held
        self.held, self.entered = True, self.entered + 1

    def __exit__(self, *exc):
        self.held = False


def test_time_model_measures_holding_its_lock_only_when_it_measures():
    lock = _CountingLock()
    tm = TimeModel(repeats=1, lock=lock)
    tm.seconds([_relu_call(2), _relu_call(4)])
    assert lock.entered == 1 and len(tm.table) == 2 and not lock.held
    tm.seconds([_relu_call(4)])  # known: nothing to time, the lock is left to others
    assert lock.entered == 1


def test_a_key_is_timed_until_its_calls_add_up_to_enough_seconds(monkeypatch):
    """``repeats`` timed calls after a warm-up, or fewer once they add up to ``enough`` seconds; a
    warm-up that alone takes ``enough`` and ``warm_enough`` is the timing (each call takes 2 ms of a
    made-up clock)."""
    from recompute.capture import timing

    now = [0.0]
    monkeypatch.setitem(timing.CLOCKS, "made-up", lambda: now[0])
    calls = []

    def op() -> None:
        calls.append(None)
        now[0] += 0.002

    for enough, warm_enough, made in ((float("inf"), 0.002, 1 + 3), (0.003, 0.002, 1 + 2), (0.002, 0.002, 1),
                                      (0.002, 1.0, 1 + 1)):
        calls.clear()
        now[0] = 0.0
        tm = TimeModel(repeats=3, clock="made-up", enough=enough, warm_enough=warm_enough)
        tm.measure([timing.OpCall(op, (), {})])
        assert len(calls) == made and list(tm.table.values()) == [pytest.approx(0.002)], enough
    with pytest.raises(ValueError, match="enough"):
        TimeModel(enough=0)


def test_batch_extrapolation_is_linear_in_the_batch():
    small, large, target = ([c] for c in (_relu_call(2), _relu_call(4), _relu_call(10)))
    tm = TimeModel()
    tm.table[small[0].key], tm.table[large[0].key] = 1.0, 2.0
    ex = BatchExtrapolation(tm, 2, 4, 10)
    ex.add(small, large, target)
    assert ex.seconds(target) == pytest.approx(1.0 + 1.0 * (10 - 2) / (4 - 2))
    with pytest.raises(KeyError, match="no probe"):
        ex.seconds([_relu_call(6)])
    at_target = BatchExtrapolation(tm, 2, 2, 2)  # the target no larger than a probe: timed there, not extended
    at_target.add(small, small, small)
    assert at_target.seconds(small) == 1.0
    with pytest.raises(ValueError, match="probe batches"):
        BatchExtrapolation(tm, 2, 2, 4)


def test_a_long_call_is_extended_in_proportion_to_the_batch_untimed_at_the_large_probe():
    calls = {b: [_relu_call(b)] for b in (2, 4, 10)}
    tm = TimeModel()
    tm.table[calls[2][0].key] = 1.0  # the large probe's key stays untimed: measuring it would fail here
    tm.measure = lambda todo: [c for c in todo if c.key not in tm.table] and pytest.fail("timed the large probe")
    ex = BatchExtrapolation(tm, 2, 4, 10, proportional=0.5)
    ex.add(calls[2], calls[4], calls[10])
    assert ex.seconds(calls[10]) == pytest.approx(1.0 * 10 / 2)
    with pytest.raises(ValueError, match="proportional"):
        BatchExtrapolation(tm, 2, 4, 10, proportional=0)


def _relu_call(batch: int):
    from recompute.capture.timing import OpCall, TensorSpec

    return OpCall(torch.ops.aten.relu.default, (TensorSpec((batch, 3), (3, 1), torch.float32, "cpu"),), {})


@pytest.mark.parametrize("name", ["vgg19", pytest.param("googlenet", marks=pytest.mark.slow)])
def test_a_budget_at_the_planners_own_smallest_peak_is_met(name):
    """On the compile path the DP plans with the liveness model and its plan is priced by the
    simulator: with no budget the smallest simulated peak is searched over budgets above the DP's own
    smallest, so a budget at that peak must find a plan too (GoogLeNet's was refused, the error naming
    a larger smallest budget; of the zoo at this size only GoogLeNet's graph showed it, and its capture
    takes half a minute: in the slow set)."""
    from recompute.planners.registry import plan

    model, inputs = nets.build(name, batch_size=2, input_size=32, seed=0)
    _, _, part = our_partition(capture(model, inputs), "approxdp", strategy="tc", memory_model="simulator")
    again = plan(part.graph, "approxdp", strategy="tc", budget=part.plan.peak, memory_model="simulator")
    assert again.peak <= part.plan.peak
