"""The simulator's peak is the measured peak of the schedule the executor runs."""

from __future__ import annotations

import operator
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import recompute
from experiments import nets
from recompute.core.fxnodes import is_random
from recompute.doors.measure import default_loss, measure
from recompute.pricing.schedule import canonical
from recompute.pricing.simulate import simulate
from recompute.planners.registry import spec

from .models import RandomDAGNet
from .test_execute import random_sequence
from recompute.rewrites.pipeline import with_in_place, with_late_recompute


def measured(model: torch.nn.Module, inputs: tuple, graph: recompute.Graph, plan: recompute.Plan,
             backend: str = "fake") -> int:
    """The step's peak: its tensor storages (``fake``, for a graph traced without workspaces), or the
    CPU allocator's (``cpu``: the storages and what ops allocate inside themselves)."""
    return measure(model, inputs, runner=recompute.execute(graph, plan, model), backend=backend,
                   iterations=1, warmup=1).peak_bytes


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_simulated_equals_measured_on_random_models(seed):
    # traced with its loss: without, the caller's loss (its scalar and autograd's seed) is outside the step
    model = RandomDAGNet(seed)
    x = torch.randn(2, 4, 6, 6)
    graph = recompute.trace(model, (x,), loss_fn=default_loss, workspaces=False)
    rng = random.Random(seed)
    vanilla = recompute.plan(graph, "vanilla")
    assert vanilla.peak == measured(model, (x,), graph, vanilla)
    for _ in range(3):
        p = random_sequence(graph, rng)
        sim = simulate(graph.program, canonical(graph, p.lower_sets)).peak
        assert sim == measured(model, (x,), graph, p)
        written = with_in_place(p, graph)  # pointwise ops writing into inputs that die there
        assert written.peak <= sim and written.peak == measured(model, (x,), graph, written)


@pytest.mark.parametrize("name", ["vgg19", "unet"] + [
    pytest.param(name, marks=pytest.mark.slow) for name in ("resnet50", "googlenet", "densenet161", "pspnet", "resnet152")
])  # the slow ones at paper scale: python -m benchmarks.simulator (GoogLeNet's concatenations: U-Net's here; ResNet-50's
# residual additions and BatchNorm: the random models' and resblock's here)
def test_simulated_equals_measured_on_the_zoo(name):
    """The CPU allocator's peak of the real step, what its ops allocate inside themselves included
    (traced on real tensors, the simulator counts those: recompute.workspace)."""
    model, inputs = nets.build(name, batch_size=2, input_size=64 if name in ("unet", "pspnet") else 32)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    assert graph.program.workspace
    for method, strategy in (("vanilla", None), ("chen", None), ("approxdp", "mc")):
        p = recompute.plan(graph, method, strategy=strategy)
        assert p.memory_model == "simulator"
        assert 0 <= measured(model, inputs, graph, p, "cpu") - p.peak <= _generator_states(graph, p), method
        written = with_in_place(p, graph)
        assert written.peak <= p.peak, method
        assert 0 <= measured(model, inputs, graph, written, "cpu") - written.peak <= _generator_states(graph, written), method


def _generator_states(graph: recompute.Graph, p: recompute.Plan) -> int:
    """Bytes of the CPU generator states the executor keeps for the random ops it recomputes (VGG's
    dropout: recompute.execute replays each one's mask), which the simulator does not count."""
    joint = graph.program.joint
    again = {name for name, copy in p.runs(graph).steps if copy > 0 and is_random(joint.node(name))}
    return len(again) * torch.get_rng_state().numel()


def test_a_budget_bounds_the_measured_peak():
    model, inputs = nets.build("resblock")
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    vanilla = recompute.plan(graph, "vanilla").peak
    smallest = recompute.plan(graph, "approxdp", strategy="tc").peak
    for budget in (smallest, (smallest + vanilla) // 2, vanilla):
        p = recompute.plan(graph, "approxdp", strategy="tc", budget=budget)
        assert p.peak <= budget
        assert measured(model, inputs, graph, p) <= budget
    with pytest.raises(recompute.InfeasibleBudget) as err:
        recompute.plan(graph, "chen", budget=smallest // 4)
    assert err.value.min_budget is not None and err.value.min_budget > smallest // 4


def test_schedule_runs_every_op_once_and_recomputes_the_plan():
    model, inputs = nets.build("resblock")
    graph = recompute.trace(model, inputs)
    p = recompute.plan(graph, "approxdp", strategy="mc")
    s = canonical(graph, p.lower_sets)
    joint = graph.program.joint
    originals = [name for name, copy in s.steps if copy == 0]
    assert sorted(originals) == sorted(n.name for n in joint.forward + joint.backward)
    again = {graph.program.group[name] for name, copy in s.steps if copy > 0}
    assert again <= set(p.recomputed())
    # a recomputation runs only where a later step reads its result (a cached block output stands
    # for the ops that made it), but the getitems of a multi-output op it keeps
    later = [set(r for reads in s.reads[i + 1:] for r in reads) for i in range(len(s))]
    unread = [inst for i, inst in enumerate(s.steps) if inst[1] > 0 and inst not in later[i]]
    assert all(joint.node(name).target is operator.getitem for name, _ in unread)
    assert len(again) < len(p.recomputed())  # the mc plan caches block outputs made by BatchNorm and ReLU
    assert s.backward_start == len(graph.program.prologue) + sum(len(m) for m in graph.program.members)


def test_planners_declare_their_options():
    g = recompute.Graph.from_edges([(0, 1), (1, 2)], [4, 4, 4], [1, 1, 1])
    assert "memory_model" in spec("approxdp").options
    with pytest.raises(TypeError, match="has no option 'memroy_model'.*memory_model"):
        recompute.plan(g, "approxdp", memroy_model="paper")
    with pytest.raises(TypeError, match="'chen' has no option"):
        recompute.plan(g, "chen", memory_model="paper")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["resnet50", "vgg19", "googlenet", "unet"])
def test_simulated_peak_against_a_cuda_step(name):
    # what the caching allocator hands out: the simulated storages and the ops' workspaces (traced on
    # the GPU, measured there: recompute.workspace), with the allocator's rounding (tests/test_workspace.py)
    model, inputs = nets.build(name, batch_size=8, input_size=128 if name == "unet" else 64, seed=0)
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    graph = recompute.trace(model, inputs, loss_fn=default_loss)
    mc = recompute.plan(graph, "approxdp", strategy="mc")
    late = with_late_recompute(mc, graph)
    plans = [recompute.plan(graph, "vanilla"), recompute.plan(graph, "chen"), mc, late, with_in_place(late, graph)]
    for p in plans:
        method = p.method + "".join(f" +{k}" for k in ("late recomputations", "in place") if k in p.info)
        got = measure(model, inputs, runner=recompute.execute(graph, p, model), backend="cuda", iterations=1).peak_bytes
        print(f"{name} {method}: simulated {p.peak}, cuda {got} ({got / p.peak:.4f})")
        assert p.peak - 2**20 <= got <= 1.02 * p.peak + 16 * 2**20, method
