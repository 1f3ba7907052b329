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
    # op by op on the CPU the plan counts what oneDNN's convolutions allocate inside themselves, which
    # min-cut's predicted peak leaves out: planned at that peak, it would not fit
    ("compiled approxdp-tc min", "ours", "compile",
     {"method": "approxdp", "strategy": "tc", "remat": 0.0, "runtime": "eager"}),
]


@pytest.mark.skipif(not g.has_peak_meter(), reason="needs Linux's /proc/self/clear_refs")
def test_ground_truth_runs_each_method_in_its_own_process():
    # one method in a spawned child (it imports torch and recompute: ~10 s); the others run what a child
    # runs, here in this process
    (spawned,) = g.run_net("skip", steps=1, batch=8, size=32, methods=METHODS[3:])
    assert spawned.method == METHODS[3][0]
    rows = [*(g._child(("skip", 8, 32, *m, 1)) for m in METHODS[:3]), spawned]
    assert all(r.status == "ok" and r.peak > 0 and r.seconds > 0 and len(r.times) == 1 for r in rows), rows
    assert rows[0].predicted is None and rows[2].predicted > 0 and rows[3].predicted > 0
    # a method that fails is a row saying why
    failed = g._child(("skip", 8, 32, "no such method", "ours", "optimize", {"method": "nonesuch"}, 1))
    assert failed.status.startswith("ValueError") and failed.peak is None
    text = g.table([*rows, failed])
    assert "eager" in text and "1.000×" in text
