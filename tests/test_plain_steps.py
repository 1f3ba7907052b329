"""``benchmarks.plain_steps`` on a tiny network: the three plain steps priced in rounds, the order turned round."""

from __future__ import annotations

from benchmarks import head_to_head as h
from benchmarks import plain_steps as ps
from benchmarks.extrapolation import op_kind


def test_the_plain_steps_are_priced_in_rounds_of_alternating_order():
    per_round, kinds = ps.rounds("dropout", 6, 16, 2)  # batch 6: extended from the probes at 2 and 4
    assert [r[:2] for r in per_round] == [[1, "eager"], [2, "ours in place"]]
    assert all(float(x) > 0 for r in per_round for x in r[2:])
    assert all(len(k) == 1 + len(ps.STEPS) for k in kinds)


def test_eager_and_our_plain_step_differ_only_where_ours_writes_in_place_or_decomposes_otherwise():
    eager, ours, in_place = (h.step_calls("dropout", 2, 16, s) for s in ps.STEPS)
    assert "bernoulli_" in {op_kind(c) for c in eager} and "native_dropout" in {op_kind(c) for c in ours}
    written = [str(c.target) for c in in_place if str(c.target).endswith((".grad_input", "_.default"))]
    assert written and not any(str(c.target).endswith(".grad_input") for c in ours)  # ReLU in place, its backward into its input
