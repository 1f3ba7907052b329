"""Graph extraction: node counts of the zoo, no bogus nodes, costs, saved bytes and clear errors."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

import recompute
from recompute.capture import costs
from experiments import nets
from recompute.capture.timing import node_call
from recompute.core.graph import Graph

from .exactness import check_plans
from .models import TimeTable, Tricky


def test_inplace_views_and_multi_output_ops_make_no_bogus_nodes():
    g = recompute.trace(Tricky(), (torch.randn(2, 4, 4, 4),))
    ops = [op.split(".")[1] for op in g.ops]
    assert ops == ["convolution", "_native_batch_norm_legit_functional", "relu", "mul", "add", "addmm"]
    assert g.preds == ((), (0,), (1,), (2,), (3,), (4,))  # chunk/flatten views keep relu → mul → add → fc
    batch_out = 2 * 4 * 4 * 4 * 4
    assert g.mem[0] == batch_out and g.mem[2] == batch_out and g.mem[3] == batch_out // 2


class _Spare(nn.Module):
    """A parameter the step never reads (a spare head), one read only through a view, one directly."""

    def __init__(self):
        super().__init__()
        self.a, self.spare = nn.Linear(4, 4), nn.Linear(4, 2)
        self.w = nn.Parameter(torch.randn(2, 4))

    def forward(self, x):
        return torch.relu(self.a(x)) @ self.w.t()


def test_parameters_the_step_never_reads_get_no_gradient_and_the_rest_train_exactly():
    model, x = _Spare().double(), torch.randn(3, 4, dtype=torch.float64)
    plans = check_plans(model, (x,), [lambda g: recompute.plan(g, "vanilla"), lambda g: recompute.plan(g, "chen")])
    recompute.execute(recompute.trace(model, (x,)), plans[1], model)(x).sum().backward()
    assert model.spare.weight.grad is None and model.spare.weight.requires_grad
    assert model.a.weight.grad is not None and model.w.grad is not None


def test_a_traced_model_is_freed_with_its_graph():
    """A ReLU saves its own output for backward: traced, that made a cycle inside autograd's C++ which
    kept every trace's graph and the model's parameters alive (a test worker grew by one paper
    network's parameters per trace)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3), nn.ReLU())
    weight = weakref.ref(model[0].weight)
    graph = recompute.trace(model, (torch.randn(2, 3, 8, 8),))
    assert graph.n > 0
    del model, graph
    gc.collect()
    assert weight() is None


def test_costs_and_saved_bytes():
    model, inputs = nets.build("chain")
    paper = recompute.trace(model, inputs)
    assert [int(t) for t in paper.time] == [10 if "conv" in op else 1 for op in paper.ops]
    flops = recompute.trace(model, inputs, cost_model="flops")
    conv, relu = paper.ops.index("aten.convolution.default"), paper.ops.index("aten.relu.default")
    assert flops.time[conv] > flops.time[relu] >= 1
    measured = recompute.trace(model, inputs, cost_model="measured")
    assert (measured.time >= 1).all()
    assert costs._traced_device(measured.program) == torch.device("cpu")  # timed where the model runs
    # a conv output read only by a ReLU is never saved (ReLU saves its output); the ReLU's is
    assert paper.saved[conv] == 0 and paper.saved[relu] == paper.mem[relu]
    with pytest.raises(ValueError, match="unknown cost_model 'nope'.*paper, flops, measured"):
        recompute.trace(model, inputs, cost_model="nope")
    with pytest.raises(ValueError, match="cost_model 'flops' takes no options; got repeats"):
        recompute.trace(model, inputs, cost_model="flops", repeats=3)
    with pytest.raises(ValueError, match="cost_model 'measured' takes device, repeats, time_model; got repaets"):
        recompute.optimize(model, method="approxdp", cost_model="measured", cost_options={"repaets": 3})


def test_measured_costs_are_the_time_models_seconds_of_each_nodes_calls():
    """T_v under a given time model: the seconds of the calls of v's members, in nanoseconds; the
    planner (eager and compiled) plans with those."""
    model, inputs = nets.build("chain")
    table = TimeTable({"aten.convolution.default": 0.25, "aten.relu.default": 2e-6})
    g = recompute.trace(model, inputs, cost_model="measured", time_model=table)
    calls = [[node_call(n) for n in nodes if node_call(n) is not None] for nodes in g.program.members]
    expected = [round(sum(table.seconds.get(str(c.target), 1e-3) for c in group) * 1e9) for group in calls]
    assert g.time.tolist() == expected and g.cost_model == "measured"
    assert 250_000_000 in expected and any(len(group) > 1 for group in calls)  # views are calls too
    wrapped = recompute.optimize(model, method="approxdp", cost_model="measured", cost_options={"time_model": table})
    wrapped(*inputs).sum().backward()
    assert wrapped.graph.time.tolist() == expected
    b = recompute.backend("approxdp", cost_model="measured", cost_options={"time_model": table})
    torch.compile(copy.deepcopy(model), backend=b)(*inputs)
    conv = [t for op, t in zip(b.partitions[-1].graph.ops, b.partitions[-1].graph.time) if "convolution" in op]
    assert conv and all(t >= 250_000_000 for t in conv)


@pytest.mark.parametrize("name, batch, size", [
    ("resblock", 4096, 128),
    pytest.param("pspnet", 8, None, marks=pytest.mark.slow),  # paper scale; all seven: benchmarks/memory.py
])
def test_fake_inputs_trace_paper_scale_without_allocating(name, batch, size):
    model, inputs = nets.build(name, batch_size=batch, input_size=size, fake_inputs=True)
    assert isinstance(inputs[0], torch._subclasses.fake_tensor.FakeTensor)
    g = recompute.trace(model, inputs)
    assert g.total_mem() > 30 * 2**30  # tens of GiB of activations, none allocated


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if self.fc(x).sum() > 0:  # Python control flow on a tensor value
            return x
        return -x


def test_untraceable_model_names_the_line_and_the_fix():
    with pytest.raises(recompute.TraceError) as err:
        recompute.trace(DataDependent(), (torch.randn(2, 4),))
    msg = str(err.value)
    assert "DataDependent" in msg and "test_trace.py" in msg and "if self.fc(x).sum() > 0" in msg
    assert "torch.cond" in msg


def test_graph_from_edges_checks_its_input():
    g = Graph.from_edges([(0, 1), (1, 2), (0, 2)], mem=[1, 2, 3], time=[1, 1, 1])
    assert g.succs == ((1, 2), (2,), ()) and g.outputs == (2,) and g.num_edges == 3
    with pytest.raises(ValueError, match="cycle"):
        Graph.from_edges([(0, 1), (1, 0)], mem=[1, 1], time=[1, 1])
    with pytest.raises(ValueError, match="outside"):
        Graph.from_edges([(0, 5)], mem=[1, 1], time=[1, 1])
    with pytest.raises(ValueError, match="one entry per node"):
        Graph.from_edges([], mem=[1, 1], time=[1])
