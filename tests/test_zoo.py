"""The paper's seven networks at tiny inputs (ResNet-152 in the slow set), each traced once: the
paper's node count, and training under every planner exactly equal to plain training."""

from __future__ import annotations

import pytest
import torch

import recompute
from experiments import nets
from recompute.planners.registry import spec

from .exactness import check_plans
from .test_execute import ZOO_METHODS, by_method


def tiny_build(name: str, **kwargs) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return nets.build(name, batch_size=2, input_size=64 if name in ("unet", "pspnet") else 32, **kwargs)


def assert_close_to_the_papers_node_count(g: recompute.Graph, name: str) -> None:
    paper = nets.spec(name).paper_nodes
    assert abs(g.n - paper) <= 0.1 * paper, (g.n, paper)
    assert g.outputs == (g.n - 1,)
    assert list(g.topo_order) == list(range(g.n))  # traced ids follow execution order
    assert (g.mem > 0).all() and (g.time > 0).all()


def own_smallest(method: str, strategy: str, memory_model: str):
    """``method``'s plan at the smallest budget of its own memory model: one solve. ``recompute.plan``
    would price six budgets by the simulator and keep the smallest peak, which on GoogLeNet's 8837
    lower sets takes two minutes of exact DP; which budget chose the lower sets is not what is tested."""
    return lambda g: spec(method).solve(g, None, strategy, {"memory_model": memory_model})


# In the slow set, with the paper-scale checks, the three whose trace alone takes most of a minute on two
# cores: ResNet-152 (ResNet-50's bottleneck blocks three times deeper), DenseNet-161 (its dense layers
# train bitwise in tests/test_remat.py and tests/test_where_users_hold_it.py) and PSPNet (its
# upsampling: tests/test_remat.py)
SLOW = ("resnet152", "densenet161", "pspnet")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in nets.names(paper_only=True)])
def test_zoo_traces_close_to_the_papers_node_count_and_every_method_is_exact(name):
    # the paper's GoogLeNet had no BatchNorm (torchvision's, with it, trains exactly in tests/test_remat.py)
    model, inputs = tiny_build(name, **({"batch_norm": False} if name == "googlenet" else {}))
    graph = recompute.trace(model, inputs)
    assert_close_to_the_papers_node_count(graph, name)
    makers = [by_method(*m) if m[0] != "exactdp" else own_smallest(*m) for m in ZOO_METHODS]
    for plan in check_plans(model, inputs, makers, dtype=torch.float32, graph=graph):
        assert plan.method == "vanilla" or plan.recomputed(), f"{plan.method}: a plan should recompute something"
