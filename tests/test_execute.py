"""The executor gives exactly plain training's loss, gradients, BatchNorm statistics and RNG stream."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import recompute
from recompute.core import lowerset
from experiments import nets
from recompute.doors.exactness import compare
from recompute.doors.measure import MemoryMeter, default_loss
from recompute.planners.registry import Plan

from .exactness import check_plan, check_plans, train_step
from .models import LiteralConstant, RandomDAGNet, Tricky

# (method, strategy, memory model): every planner, the DPs under both memory models
METHODS = [("vanilla", None, None), ("chen", None, None), ("chen_greedy", None, None)] + [
    (dp, strategy, model) for dp in ("approxdp", "exactdp") for strategy in ("tc", "mc") for model in ("paper", "liveness")
]
SMALL = ["chain", "skip", "siamese", "dropout", "resblock"]
# the zoo at tiny inputs: every planner once (the DPs' memory model only steers their search)
ZOO_METHODS = [m for m in METHODS if m[2] != "paper"]


def by_method(method: str, strategy: str | None = None, memory_model: str | None = None):
    options = {"memory_model": memory_model} if memory_model else {}
    return lambda g: recompute.plan(g, method, strategy=strategy, **options)


def random_sequence(g: recompute.Graph, rng: random.Random) -> Plan:
    """A random increasing lower-set sequence: cumulative unions of random L_v."""
    family = lowerset.pruned_lower_sets(g)
    seq: list[frozenset[int]] = []
    current: frozenset[int] = frozenset()
    for lower in rng.sample(family, k=rng.randint(1, min(8, len(family)))):
        current |= lower
        if not seq or current != seq[-1]:
            seq.append(current)
    if seq[-1] != g.nodes:
        seq.append(g.nodes)
    return Plan.from_sequence(g, seq, method="random")


@pytest.mark.parametrize("net", SMALL)
def test_small_nets_every_method(net):
    model, inputs = nets.build(net)
    check_plans(model, inputs, [by_method(*m) for m in METHODS])


@pytest.mark.parametrize("seed", range(8))
def test_random_dag_models_random_plans(seed):
    model = RandomDAGNet(seed)
    x = torch.randn(2, 4, 6, 6)
    rng = random.Random(seed)
    graph = recompute.trace(model.double(), (x.double(),))  # once: check_plans' float64 trace
    for trial in range(4):  # each plan with dropout drawn from its own seed
        check_plans(model, (x,), [lambda g: random_sequence(g, rng)], seed=trial, graph=graph)
    check_plans(model, (x,), [by_method("approxdp", "mc")], graph=graph)


def test_inplace_ops_and_views_of_inputs_are_exact():
    model, x = Tricky(), torch.randn(2, 4, 4, 4)
    rng = random.Random(0)
    check_plans(model, (x,), [lambda g: random_sequence(g, rng) for _ in range(6)])


def test_dropout_recomputed_with_the_same_mask():
    model, inputs = nets.build("dropout")
    graph = recompute.trace(model, inputs)
    dropouts = {v for v in range(graph.n) if "dropout" in graph.ops[v]}
    assert dropouts

    def recompute_dropout(g):
        # blocks that end right after each dropout's successor, so every dropout is in some V_i \ ∂(L_i)
        family = lowerset.pruned_lower_sets(g)
        seq = sorted({family[w] for v in dropouts for w in g.succs[v]} | {g.nodes}, key=len)
        return Plan.from_sequence(g, seq, method="hand")

    plan = check_plan(model, inputs, recompute_dropout, seed=3)
    assert dropouts & plan.recomputed(), "the test must recompute a dropout node"


def test_bn_statistics_updated_once_unlike_torch_checkpoint():
    model, inputs = nets.build("resblock")
    model = model.double()
    inputs = tuple(x.double() for x in inputs)
    plain, ckpt = copy.deepcopy(model), copy.deepcopy(model)
    ref = train_step(plain, plain, inputs, 0)
    # torch.utils.checkpoint runs BatchNorm's forward again in backward: statistics move twice
    train_step(ckpt, lambda x: checkpoint(ckpt, x, use_reentrant=False), inputs, 0)
    bn = next(n for n, _ in model.named_buffers() if n.endswith("num_batches_tracked"))
    assert dict(ckpt.named_buffers())[bn].item() == 2 * ref[f"buffer:{bn}"].item()
    check_plan(model, inputs, by_method("approxdp", "mc"))


def test_optimize_trains_like_the_model_in_a_loop():
    model, inputs = nets.build("resblock")
    model = model.double()
    x = inputs[0].double()
    plain, planned = copy.deepcopy(model), copy.deepcopy(model)
    wrapped = recompute.optimize(planned, (x,), method="approxdp", strategy="mc")
    assert wrapped.plan is not None and wrapped.plan.recomputed()
    for m, fwd in ((plain, plain), (planned, wrapped)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        torch.manual_seed(0)
        for _ in range(3):
            opt.zero_grad()
            fwd(x).square().mean().backward()
            opt.step()
    for (name, a), b in zip(plain.state_dict().items(), planned.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=name)
    wrapped.eval()
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), plain.eval()(x))


def test_measured_peak_below_vanilla_on_fake_backend():
    """Chen's, ApproxDP's and every DP plan under the liveness model at batch 16, 224×224: in small, the
    paper-scale claim of test_every_dp_plan_below_vanilla_at_paper_scale (slow)."""
    model, inputs = nets.build("resnet50", batch_size=16, input_size=224, fake_inputs=True)
    graph = recompute.trace(model, inputs)
    vanilla = recompute.measure(model, inputs, backend="fake")
    dps = [(dp, strategy, "liveness") for dp in ("approxdp", "exactdp") for strategy in ("tc", "mc")]
    for method, strategy, memory_model in [("approxdp", "tc", None), ("approxdp", "mc", None), ("chen", None, None)] + dps:
        plan = by_method(method, strategy, memory_model)(graph)
        got = recompute.measure(model, inputs, runner=recompute.execute(graph, plan), backend="fake")
        assert got.peak_bytes < 0.7 * vanilla.peak_bytes, (method, strategy, memory_model)


def test_cpu_and_fake_backends_agree():
    """On tensor storages the two agree; the CPU's allocator also hands out what ops allocate inside
    themselves, which the simulator counts on a step traced on real CPU tensors (its workspaces)."""
    model, inputs = nets.build("resblock")
    graph = recompute.trace(model, inputs, loss_fn=default_loss)  # the step measure runs
    ex = recompute.execute(graph, recompute.plan(graph, "approxdp", strategy="mc"))
    cpu = recompute.measure(model, inputs, runner=ex, backend="cpu", iterations=1, warmup=0)
    fake = recompute.measure(model, inputs, runner=ex, backend="fake")
    assert cpu.storage_peak_bytes == fake.peak_bytes == fake.storage_peak_bytes > 0
    assert cpu.activation_peak_bytes == fake.activation_peak_bytes < cpu.storage_peak_bytes
    assert graph.program.workspace and cpu.peak_bytes == ex.plan.peak >= cpu.storage_peak_bytes
    assert cpu.seconds is not None and fake.seconds is None


def test_peak_without_the_parameter_gradients():
    meter = MemoryMeter()
    with meter:
        a = torch.ones(100)  # 400 B, freed before b exists
        grad = torch.ones(50)  # 200 B, live at the end like a parameter gradient
        del a
        b = torch.ones(10)
        assert meter.peak == 600 and meter.peak_without([grad]) == 400 and meter.peak_without([b]) == 600


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_backend_measures_and_is_exact():
    model, inputs = nets.build("resblock")
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    graph = recompute.trace(model, inputs)
    plan = recompute.plan(graph, "approxdp", strategy="mc")
    ex = recompute.execute(graph, plan)
    vanilla = recompute.measure(model, inputs, backend="cuda", iterations=2)
    got = recompute.measure(model, inputs, runner=ex, backend="cuda", iterations=2)
    assert got.peak_bytes > 0 and vanilla.peak_bytes > 0 and got.seconds > 0
    plain, planned = copy.deepcopy(model), copy.deepcopy(model)
    ref = train_step(plain, plain, inputs, 0)
    graph = recompute.trace(planned, inputs)
    out = train_step(planned, recompute.execute(graph, recompute.plan(graph, "approxdp", strategy="mc")), inputs, 0)
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("name", nets.names(paper_only=True))
def test_every_dp_plan_below_vanilla_at_paper_scale(name):
    """Issue 4's claim, on the fake backend at the paper's batch and input size (liveness model).

    Minutes per network: in the ``slow`` set; in small, test_measured_peak_below_vanilla_on_fake_backend;
    the table: ``python -m benchmarks.memory``.
    """
    model, inputs = nets.build(name, fake_inputs=True)
    graph = recompute.trace(model, inputs)
    vanilla = recompute.measure(model, inputs, backend="fake").peak_bytes
    for method in ("approxdp", "exactdp"):
        for strategy in ("tc", "mc"):
            plan = recompute.plan(graph, method, strategy=strategy, memory_model="liveness")
            got = recompute.measure(model, inputs, runner=recompute.execute(graph, plan), backend="fake")
            assert got.peak_bytes < vanilla, (method, strategy)



@pytest.mark.parametrize("method", ["chen", "approxdp"])
def test_constants_the_forward_makes_are_read_by_both_halves(method):
    torch.manual_seed(0)
    model, x = LiteralConstant(), torch.randn(3, 4, requires_grad=True)
    assert compare(model, recompute.optimize(model, (x,), method=method), (x,)).bitwise


class _WritesItsBuffer(torch.nn.Module):
    """Adds a buffer in every layer, then scales the buffer in place: a recomputed add would read the new value."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(6))
        self.register_buffer("shift", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x) + self.shift)
        self.shift.mul_(1.5)
        return x


def test_a_recomputation_reading_a_buffer_the_step_writes_is_refused():
    model, x = _WritesItsBuffer(), torch.randn(4, 8)
    graph = recompute.trace(model, (x,))
    plan = recompute.plan(graph, "chen")
    assert plan.recomputed()
    with pytest.raises(NotImplementedError, match="buffer shift is written by the step and read by a recomputed op"):
        recompute.execute(graph, plan, model)(x)
