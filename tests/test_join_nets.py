"""The join networks of Beaumont et al. (2020) in the zoo: they build, train one step with a scalar loss,
trace with ``recompute.trace`` and map onto joins of the right shape (recompute/planners/pebble/graphmap.py)."""

from __future__ import annotations

import pytest
import torch

import recompute
from experiments import nets
from recompute.planners.pebble import c_min, chain_of, join_dp, join_of, simulate

TINY = dict(batch_size=2, input_size=8, seed=0, L=1, width=4, embed=8)


@pytest.mark.parametrize("name, inputs", [("snn", 3), ("cross_modal", 2)])
def test_join_nets_build_train_and_trace(name: str, inputs: int) -> None:
    model, xs = nets.build(name, **TINY)
    assert len(xs) == inputs == nets.spec(name).num_inputs
    loss = model(*xs)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    g = recompute.trace(model, xs)
    assert len(g.outputs) == 1
    jm = join_of(g)
    assert len(jm.lengths) == inputs
    # every node of V is in exactly one step or in the head
    nodes = sorted([v for br in jm.branches for s in br for v in s.nodes] + list(jm.head))
    assert nodes == list(range(g.n))
    s = join_dp(jm.lengths, c_min(jm.lengths) + 1)
    assert simulate(s, jm.profile).peak_bytes > 0
    assert chain_of(g).lengths[0] < g.n  # the branches run side by side, so the chain has fewer cuts


def test_snn_branches_are_equal_and_weights_shared() -> None:
    model, xs = nets.build("snn", **TINY)
    enc = model.encoders
    assert len(enc) == 1  # held once, run on the three inputs
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in enc[0].modules())
    assert convs == 2  # 2L blocks at L = 1
    lengths = join_of(recompute.trace(model, xs)).lengths
    assert len(set(lengths)) == 1
    unshared, _ = nets.build("snn", **TINY, shared=False)
    assert unshared.encoders[0] is not unshared.encoders[1]


def test_cross_modal_branch_lengths_follow_L_and_5L() -> None:
    def lengths(L: int) -> tuple[int, ...]:
        model, xs = nets.build("cross_modal", **{**TINY, "L": L})
        return join_of(recompute.trace(model, xs)).lengths

    one, two = lengths(1), lengths(2)
    # each conv block adds two steps (conv, ReLU): the image branch grows 5× as fast as the other
    assert (two[0] - one[0], two[1] - one[1]) == (10, 2)


def test_paper_sizes_trace_without_allocating() -> None:
    model, xs = nets.build("snn", fake_inputs=True)
    jm = join_of(recompute.trace(model, xs))
    assert jm.lengths == (62, 62, 62)  # 2L = 30 blocks of (conv, ReLU), pooling, embedding
