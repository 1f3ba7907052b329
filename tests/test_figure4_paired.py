"""Figure 4's paired design: same-round ratios, bootstrap intervals over rounds, Holm's correction."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import figure4_paired as f4
from recompute.doors.measure import interleaved


def _point(batch: int, chen_factor: float, rng: np.random.Generator, rounds: int = 9) -> f4.PairedPoint:
    drift = 1 + 0.3 * rng.random(rounds)  # the host's drift: shared by every method of a round
    noise = lambda: 1 + 0.01 * rng.standard_normal(rounds)  # noqa: E731
    times = {"vanilla": list(drift * noise()), "chen": list(chen_factor * drift * noise()),
             "approxdp_tc": list(drift * noise()), "approxdp_mc": list(1.02 * drift * noise())}
    return f4.PairedPoint("resnet50", batch, 64, times, "0" * 40, "test")


def test_a_same_round_ratio_sees_through_drift_that_would_hide_it():
    rng = np.random.default_rng(1)
    found = {(o.batch_size, o.a, o.b): o for o in f4.orderings([_point(64, 1.25, rng), _point(128, 1.25, rng)])}
    chen = found[(64, "chen", "vanilla")]
    assert chen.ratio == pytest.approx(1.25, rel=0.02) and chen.low < 1.25 < chen.high
    assert chen.verdict == "Chen's slower" and chen.p_holm < 0.05
    assert found[(64, "approxdp_tc", "chen")].verdict == "ApproxDP + TC faster"
    tie = found[(64, "approxdp_tc", "vanilla")]
    assert tie.verdict == "tie" and tie.low < 1 < tie.high


def test_holm_corrects_for_every_ordering_tested():
    assert f4._holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert f4._holm([0.5]) == [0.5]


def test_interleaved_rounds_rotate_the_order():
    calls = []
    times = interleaved({n: (lambda n=n: calls.append(n)) for n in "abc"}, 3)
    assert calls == list("abc" "bca" "cab") and all(len(t) == 3 for t in times.values())


def test_a_point_is_timed_on_a_real_step():
    pt = f4.time_point("chain", 2, 16, rounds=3)
    assert set(pt.times) == set(f4.METHODS) and all(len(t) == 3 and min(t) > 0 for t in pt.times.values())


def test_render_writes_the_table_the_claim_and_the_figure(tmp_path):
    rng = np.random.default_rng(2)
    points = [_point(b, 1.2, rng) for b in (64, 128)]
    claim = _point(134, 1.3, rng)
    claim.net = "resnet152"
    record = {"command": "python -m experiments.figure4_paired --write", "points": [vars(p) for p in points + [claim]]}
    f4.render(record, tmp_path / "f4")
    text = (tmp_path / "f4.md").read_text()
    assert "| resnet50 | 64 | 64² | 9 |" in text and "Holm-corrected p over all 15 orderings" in text
    assert "at resnet152 batch 134 (twice vanilla's largest batch) ApproxDP is 1.16× faster" in text
    assert (tmp_path / "f4.png").stat().st_size > 0
