"""``benchmarks.ground_truth`` end to end on a tiny network, without a C++ compiler: each method in a
process of its own, the operating system's resident-set peak, the simulator's prediction beside it."""

from __future__ import annotations

import pytest

from benchmarks import ground_truth as g

METHODS = [
    ("eager", "pytorch", "eager", {}),
    ("compile budget 0.5 (op by op)", "pytorch", "optimize",
     {"method": "torch_compile_budget", "budget_fraction": 0.5, "backend": "aot_eager_decomp_partition"}),
    ("executor approxdp-tc min", "ours", "optimize", {"method": "approxdp", "strategy": "tc"}),
    ("compiled approxdp-tc at min_cut's peak", "ours", "compile",
     {"method": "approxdp", "strategy": "tc", "remat": 0.0, "runtime": "eager", "budget": "min_cut"}),
    ("no such method", "ours", "optimize", {"method": "nonesuch"}),
]


@pytest.mark.skipif(not g.has_peak_meter(), reason="needs Linux's /proc/self/clear_refs")
def test_ground_truth_runs_each_method_in_its_own_process():
    rows = g.run_net("skip", steps=1, batch=8, size=32, methods=METHODS)
    assert [r.method for r in rows] == [m[0] for m in METHODS]
    ok = rows[:-1]
    assert all(r.status == "ok" and r.peak > 0 and r.seconds > 0 and len(r.times) == 1 for r in ok), ok
    assert ok[0].predicted is None and ok[2].predicted > 0 and ok[3].predicted > 0
    assert rows[-1].status.startswith("ValueError") and rows[-1].peak is None  # reported, the others ran
    text = g.table(rows)
    assert "eager" in text and "1.000×" in text
