"""Cheap rematerialization (``recompute.backend(..., remat=0.0)``): the minimum cut against brute force,
and training through it bitwise equal to plain training."""

from __future__ import annotations

import copy
import itertools
import random
import sys

import pytest
import torch
import torch._dynamo
from torch._functorch.partitioners import default_partition
from torchvision.models.densenet import _DenseBlock as _TorchvisionDenseBlock
from torchvision.models.googlenet import BasicConv2d, Inception

import recompute
from experiments import nets
from benchmarks import partitions
from recompute.doors.backend import _kept_from_forward
from recompute.rewrites.remat import cheapest_kept, recompute_late, rematerialize
from recompute.pricing.simulate import simulate

from .exactness import check_plans, compiled_like_plain, sgd_steps
from .models import TimeTable
from recompute.rewrites.pipeline import with_late_recompute


def _recomputed(kept: set[str], size, inputs, recomputable, needed) -> set[str] | None:
    """The values recomputed to derive ``needed`` from ``kept``; None if one of them cannot be."""
    again: set[str] = set()
    todo = [v for v in needed if v not in kept]
    while todo:
        v = todo.pop()
        if v in again or v in kept or v not in size:
            continue
        if v not in recomputable:
            return None
        again.add(v)
        todo.extend(inputs.get(v, ()))
    return again


def _random_problem(rng: random.Random, n: int):
    names = [f"v{i}" for i in range(n)]
    size = {v: rng.choice([0, 1, 2, 4, 8, 16]) for v in names}
    inputs = {v: [names[j] for j in range(i) if rng.random() < 0.3] + (["param"] if rng.random() < 0.3 else [])
              for i, v in enumerate(names)}
    recomputable = {v: rng.choice([0, 0, 1, 3]) for v in names if rng.random() < 0.6}
    needed = {v for v in names if rng.random() < 0.4} or {names[-1]}
    return size, inputs, recomputable, needed


@pytest.mark.parametrize("seed", range(40))
def test_cheapest_kept_equals_brute_force(seed):
    """The cut's kept bytes plus its recomputations' price is the least over every set of kept values
    from which the needed values can be recomputed by recomputable ops (every subset of a random
    10-value DAG)."""
    rng = random.Random(seed)
    size, inputs, recomputable, needed = _random_problem(rng, 10)
    kept, again = cheapest_kept(size, inputs, recomputable, needed)
    assert _recomputed(kept, size, inputs, recomputable, needed) is not None
    assert again <= recomputable.keys() and not kept & again

    def cost(subset: set[str]) -> float | None:
        again = _recomputed(subset, size, inputs, recomputable, needed)
        return None if again is None else sum(size[v] for v in subset) + sum(recomputable[v] for v in again)

    best = min(c for r in range(len(size) + 1) for subset in itertools.combinations(size, r)
               if (c := cost(set(subset))) is not None)
    assert sum(size[v] for v in kept) + sum(recomputable[v] for v in again) == best


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _storages_only(monkeypatch):
    """What the partitions keep is about tensor storages: at these sizes what oneDNN's convolutions
    allocate inside themselves on the CPU (recompute.workspace) would make every peak, and no cut
    would change it."""
    monkeypatch.setattr(sys.modules["recompute.capture.trace"], "step_workspace", lambda gm, on: {})


def _inception() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """GoogLeNet in small: torchvision's own Inception blocks (convolution, BatchNorm and ReLU in four
    branches, one behind a max-pool, concatenated) around a max-pool; its trace is a tenth of GoogLeNet's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(BasicConv2d(3, 8, kernel_size=3, padding=1), Inception(8, 4, 4, 8, 2, 4, 4),
                                torch.nn.MaxPool2d(3, 2, ceil_mode=True), Inception(20, 8, 4, 8, 2, 4, 4),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(24, 10))
    return model, (torch.randn(2, 3, 16, 16),)


@pytest.mark.parametrize("name, method", [("skip", "vanilla"), ("siamese", "approxdp"), ("dropout", "vanilla"),
                                          ("inception", "approxdp"),
                                          pytest.param("googlenet", "approxdp", marks=pytest.mark.slow)])
def test_remat_trains_exactly_and_keeps_fewer_bytes(name, method):
    """Two SGD steps through ``remat=0.0`` equal plain training bitwise (loss, gradients, BatchNorm
    statistics, dropout masks); the partition recomputes cheap ops, keeps fewer activation bytes
    than the same plan without them, and its simulated peak is no higher."""
    model, inputs = _inception() if name == "inception" else nets.build(
        name, batch_size=2, input_size=32 if name == "googlenet" else 16, seed=0)
    parts = compiled_like_plain(model, inputs, {remat: recompute.backend(method, remat=0.0 if remat else None)
                                                for remat in (False, True)})
    plain_part, remat_part = parts[False], parts[True]
    assert remat_part.schedule.recomputations() > plain_part.schedule.recomputations()
    assert remat_part.saved_bytes < plain_part.saved_bytes
    assert remat_part.peak <= plain_part.peak


def test_remat_prices_a_recomputation_by_its_measured_seconds():
    """Where the graph is priced in measured seconds, recomputing an op costs its seconds (at the ops'
    average bytes per second): BatchNorm's and ReLU's elementwise chain is recomputed at weight 0.5
    where it costs next to nothing beside the other cheap ops (not under the bytes-written price), and
    ReLU is not where it alone costs more than all the others."""
    model, inputs = nets.build("resblock", batch_size=2, input_size=16, seed=0)
    c = partitions.capture(model, inputs)
    chain = ("aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.relu.default", "aten.unsqueeze.default",
             "aten.squeeze.dims")

    def recomputed(**options) -> set[str]:
        part = partitions.our_partition(c, "vanilla", remat=0.5, **options)[2]
        joint = part.graph.program.joint
        return {str(joint.node(name).target) for name, copy in part.schedule.steps if copy > 0}

    def timed(seconds: dict[str, float]) -> dict:
        return {"cost_model": "measured", "cost_options": {"time_model": TimeTable(seconds)}}

    assert "aten.relu.default" in recomputed(**timed(dict.fromkeys(chain, 1e-9)))
    assert "aten.relu.default" not in recomputed()
    assert "aten.relu.default" not in recomputed(**timed({**dict.fromkeys(chain, 1e-9), "aten.relu.default": 1.0}))


@pytest.mark.parametrize("remat", [-1, True, "yes"])
def test_bad_remat_weight_is_named(remat):
    with pytest.raises(ValueError, match="remat must be None"):
        recompute.backend("approxdp", remat=remat)



@pytest.mark.parametrize("method", ["vanilla", "approxdp"])
def test_relu_mask_runs_in_the_forward_and_trains_exactly(method):
    """On the joint graph inductor partitions (its decompositions: max-pool's backward reads its
    indices, ReLU's reads ``relu <= 0``), nothing of the backward reads a ReLU output before a
    max-pool but that comparison, a backward op reading no gradient: the partition runs it in the
    forward phase and keeps the bool mask instead of the float32 output, as PyTorch's min-cut
    partitioner does. A step through it equals one through PyTorch's default partition of the same
    graph bitwise (loss and gradients)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10))
    inputs = [torch.randn(2, 3, 16, 16)]
    steps, parts = [], {}
    for remat in (None, 0.0, "default"):
        torch._dynamo.reset()
        copied = copy.deepcopy(model)
        backend = recompute.backend(method, remat=None if remat == "default" else remat)
        c = partitions.capture(copied, inputs, partition_fn=default_partition if remat == "default" else backend.partition)
        loss = c.compiled(*inputs)
        loss.backward()
        steps.append([loss.detach(), *(p.grad for p in copied.parameters())])
        parts[remat] = backend.partitions[-1] if backend.partitions else None
    for got in steps[:2]:
        assert all(torch.equal(a, b) for a, b in zip(steps[2], got))
    part = parts[0.0]
    backward = {n.name for n in part.graph.program.joint.backward}
    early = {name for name, _ in part.schedule.steps[:part.schedule.backward_start] if name in backward}
    masks = {n for n in part.saved if n in backward}
    assert masks and masks <= early and all(part.graph.program.joint.node(n).meta["val"].dtype == torch.bool for n in masks)
    assert part.saved_bytes < parts[None].saved_bytes
    assert part.peak <= parts[None].peak


class _DenseBlock(torch.nn.Module):
    """DenseNet's pattern: each layer normalises the concatenation of all earlier outputs."""

    def __init__(self, layers: int = 6):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.BatchNorm2d(8 + 4 * i), torch.nn.ReLU(), torch.nn.Conv2d(8 + 4 * i, 4, 3, padding=1))
            for i in range(layers))
        self.head = torch.nn.Linear(8 + 4 * layers, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return self.head(torch.cat(feats, 1).mean((2, 3)))


def test_cheap_values_are_recomputed_again_before_late_reads_and_train_exactly():
    """Where the backward recomputes a block, a layer's ReLU output is read by the recomputed
    convolution and, much later, by that convolution's backward: it is computed once more right
    before the later read (from the concatenation, itself recomputed from the kept convolution
    outputs) rather than held in between. The peak falls, and two SGD steps equal plain training
    bitwise (loss, gradients, BatchNorm statistics)."""
    torch.manual_seed(0)
    model, inputs = _DenseBlock(), (torch.randn(2, 3, 16, 16),)
    part = compiled_like_plain(model, inputs, {"tc": recompute.backend("approxdp", strategy="tc", remat=0.0)})["tc"]
    assert any(copy >= 2 for _, copy in part.schedule.steps)  # a value computed a third time
    program = part.graph.program
    once = rematerialize(program, _kept_from_forward(program, part.plan.runs(part.graph)), weight=0.0)
    assert recompute_late(program, once).steps == part.schedule.steps
    assert part.peak < simulate(program, once).peak


class _Bottlenecks(torch.nn.Module):
    """torchvision's dense block (BatchNorm, ReLU, 1×1 convolution, BatchNorm, ReLU, 3×3 convolution per
    layer), as DenseNet-161 has it."""

    def __init__(self, layers: int = 4):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.block = _TorchvisionDenseBlock(layers, 8, bn_size=2, growth_rate=4, drop_rate=0.0)
        self.head = torch.nn.Linear(8 + 4 * layers, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)).mean((2, 3)))


def test_the_executor_recomputes_cheap_values_late_where_that_lowers_the_peak_and_trains_bitwise():
    """``recompute.rewrites.pipeline.with_late_recompute``, the executor's counterpart. Where Chen's segments recompute dense
    layers, each layer's concatenation is read by its recomputed BatchNorm and again, after the
    layer's two convolution backwards, by BatchNorm's backward: it is computed once more then. The
    schedule is the one the simulator prices (its new peak, lower), and it trains bitwise as plain
    training does, alone and through ``recompute.optimize(..., recompute_late=True)`` inside a larger
    model; a plan it cannot improve is returned unchanged."""
    torch.manual_seed(0)
    model, inputs = _Bottlenecks(), (torch.randn(2, 3, 16, 16),)
    g = recompute.trace(model, inputs, workspaces=False)
    p = recompute.plan(g, "chen")
    late = with_late_recompute(p, g)
    assert late.peak < p.peak == simulate(g.program, p.runs(g)).peak
    assert late.peak == simulate(g.program, late.runs(g)).peak
    assert any(copy >= 2 for _, copy in late.runs(g).steps) and late.overhead > p.overhead
    every = recompute_late(g.program, p.runs(g))  # every late recomputation: the same peak, more steps
    assert simulate(g.program, every).peak == late.peak and len(every) > len(late.runs(g))
    assert late.lower_sets == p.lower_sets
    check_plans(model, inputs, [lambda _: late], dtype=torch.float32, graph=g)
    vanilla = recompute.plan(g, "vanilla")
    assert with_late_recompute(vanilla, g) is vanilla

    outer = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), model)
    plain = copy.deepcopy(outer)
    outer[1] = recompute.optimize(model, inputs, method="chen", recompute_late=True)
    got, ref = sgd_steps(outer, outer, inputs), sgd_steps(plain, plain, inputs)
    assert outer[1].plan.schedule is not None  # recomputed late, for the step as it is held here
    for a, b in zip(ref, got):
        b = {k.replace("1.model.", "1."): v for k, v in b.items()}  # the wrapper holds the block as .model
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    with pytest.raises(ValueError, match="recompute_late rewrites a plan's schedule; 'torch_sac'"):
        recompute.optimize(model, inputs, method="torch_sac", recompute_late=True)
    with pytest.raises(TypeError, match="recompute_late must be True or False, got 'yes'"):
        recompute.optimize(model, inputs, method="chen", recompute_late="yes")


class _Upsampling(torch.nn.Module):
    """A decoder stage: a convolution reads an upsampled map (a gather, ``_unsafe_index``, under
    inductor's decompositions) four times the size of what it gathers from."""

    def __init__(self) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up = torch.nn.Upsample(scale_factor=2)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(self.up(torch.relu(self.down(x)))))


def test_an_upsampled_map_is_gathered_again_in_the_backward_and_trains_exactly():
    torch.manual_seed(0)
    model, inputs = _Upsampling(), (torch.randn(2, 3, 16, 16),)
    part = compiled_like_plain(model, inputs, {"remat 0": recompute.backend("vanilla", remat=0.0)})["remat 0"]
    joint = part.graph.program.joint
    assert any(copy > 0 and joint.node(name).target == torch.ops.aten._unsafe_index.Tensor
               for name, copy in part.schedule.steps)
