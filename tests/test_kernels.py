"""``experiments.kernels.load``: the planners' numba kernels compiled or loaded before a timed solve."""

from __future__ import annotations

from experiments import kernels
from recompute.pricing.blockcost import _pair_cost
from recompute.planners.pebble.join import _join_kernel
from recompute.planners.dp import _dp_core


def test_loading_a_planner_leaves_its_kernels_loaded():
    # join_dp applies only to the second tiny network (a join of two inputs); approxdp to the first
    loaded = kernels.load(["approxdp", "join_dp"])
    assert loaded.refused == {}
    assert _dp_core.signatures and _pair_cost.signatures and _join_kernel.signatures
