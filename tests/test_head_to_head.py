"""``benchmarks.head_to_head`` end to end on a tiny network: capture, both partitioners, pricing, outputs."""

from __future__ import annotations

import importlib
import json
import math
import sys
from typing import Iterable

import pytest
import torch
from torch.utils import _pytree as pytree

from benchmarks import head_to_head as h
from recompute.capture.timing import BatchExtrapolation, OpCall, TensorSpec, TimeModel, module_calls

FIELDS = {"network", "batch_size", "input_size", "method", "knob", "family", "peak", "seconds", "time_ratio", "exact"}


class BytesTimeModel(TimeModel):
    """Each op costs a call's overhead plus its tensor arguments' bytes at 10 GB/s: the same table on
    every run, where ops timed once each on a tiny network reorder the plans from run to run."""

    def measure(self, calls: Iterable[OpCall]) -> None:
        for c in calls:
            specs = [a for a in pytree.tree_leaves((c.args, c.kwargs)) if isinstance(a, TensorSpec)]
            self.table.setdefault(c.key, 1e-6 + sum(math.prod(s.shape) * s.dtype.itemsize for s in specs) / 1e10)


def test_head_to_head_runs_end_to_end(tmp_path, monkeypatch):
    torch._dynamo.reset()
    with monkeypatch.context() as m:
        # a bar nothing has met, and all within reach: the DP's budgets are searched at its time too
        m.setattr(h, "best_at", lambda ours, **_: None)
        m.setattr(h, "BAR", 10.0)
        points = h.run_net("chain", 2, BytesTimeModel(), solvers=("dp", "greedy"),
                           torch_budgets=(0.0, 1.0), batch=4, size=16)
    torch._dynamo.reset()
    assert {p.family for p in points} == {"ours", "pytorch"}
    assert len([p for p in points if p.method == "min_cut"]) == 4
    assert {f"vanilla+remat {w:g}" for w in h.REMAT_WEIGHTS if w is not None} <= {p.method for p in points}
    assert all(p.peak > 0 and p.seconds > 0 for p in points)
    eager = [p for p in points if p.family == "pytorch" and p.method != "min_cut"]
    assert eager[0].method == "eager" and eager[0].time_ratio == 1.0 and len(eager) > 1, [p.method for p in eager]
    assert all(p.time_ratio == pytest.approx(p.seconds / eager[0].seconds) for p in eager)  # all against plain eager's
    assert next(p for p in points if p.method == "vanilla").time_ratio == 1.0
    assert {"executor vanilla", "executor approxdp_tc", "executor approxdp_mc", "executor chen"} <= {p.method for p in points}
    bar = h.smallest_fast([p for p in points if p.family == "pytorch"])
    searched = [p for p in points if p.method == "approxdp_tc+remat" and "of vanilla weight" in p.knob]
    # each of the DP's BAR_BUDGETS budgets searched at the bar's time, beside those the peak searches found
    assert len(searched) > h.BAR_BUDGETS and all(p.time_ratio <= bar.time_ratio * (1 + h.SAME_TIME) for p in searched), (bar, searched)
    h.save(points, tmp_path)
    rows = json.loads((tmp_path / "pareto_chain.json").read_text())
    assert FIELDS <= set(rows[0]) and len(rows) == len(points)
    assert h.load("chain", tmp_path) == points
    h.figure(points, tmp_path / "pareto_chain.png")
    assert (tmp_path / "pareto_chain.png").stat().st_size > 0
    assert "chain" in h.report({"chain": points}, "header")
    assert len(h.verdict(points)) == len(h.VERDICT_HEADERS)


def test_a_batch_no_larger_than_the_probes_is_timed_at_itself():
    target = h._capture("chain", 2, 16)
    ex = h.time_model("chain", 16, target, 2, TimeModel(repeats=1, clock="thread"))
    assert (ex.small, ex.large, ex.target) == (2, 2, 2)
    calls = module_calls(target.joint)
    assert ex.seconds(calls) == pytest.approx(sum(ex.model.table[c.key] for c in calls))
    larger = h._capture("chain", 6, 16)  # beyond the probes: extended from them
    ex = h.time_model("chain", 16, larger, 6, TimeModel(repeats=1, clock="thread"))
    assert (ex.small, ex.large, ex.target) == (*h.PROBES, 6) and ex.seconds(module_calls(larger.joint)) > 0


def test_a_network_can_have_probes_of_its_own(monkeypatch):
    monkeypatch.setitem(h.PROBES_OF, "chain", (3, 5))
    target = h._capture("chain", 6, 16)
    ex = h.time_model("chain", 16, target, 6, TimeModel(repeats=1, clock="thread"))
    assert (ex.small, ex.large, ex.target) == (3, 5, 6)
    assert ex.seconds(module_calls(target.joint)) > 0  # its probes were traced at 3 and 5


def test_probe_steps_run_only_where_an_op_key_has_no_probe(monkeypatch):
    """An eager method whose ops all have probes (a second plain step here; checkpointing recomputes plain
    training's ops) is recorded at the target batch alone, and priced the same."""
    batches, record = [], h._eager_calls
    monkeypatch.setattr(h, "_eager_calls", lambda name, b, *args: batches.append(b) or record(name, b, *args))
    ex = BatchExtrapolation(TimeModel(repeats=1, clock="thread"), *h.PROBES, 6)
    first, again = h.eager_points("chain", 6, 16, ex, [("eager", {}), ("eager", {})])
    assert batches == [6, *h.PROBES, 6]
    assert again.seconds == first.seconds and again.peak == first.peak


def test_a_point_is_dominated_by_one_at_most_its_peak_and_time():
    theirs = h.Point("n", 1, 1, "min_cut", "budget 0.5", "pytorch", 100, 1.1, 1.1, None)
    point = lambda peak, ratio: h.Point("n", 1, 1, "approxdp_tc", "", "ours", peak, ratio, ratio, None)  # noqa: E731
    assert h.dominated(theirs, [point(100, 1.1)]) and h.dominated(theirs, [point(120, 1.0), point(90, 1.05)])
    assert not h.dominated(theirs, [point(101, 1.0), point(90, 1.2)]) and not h.dominated(theirs, [])


def test_the_bar_is_the_fastest_of_pytorchs_smallest_peaks_within_the_window():
    """Peaks a few kilobytes apart are one peak: the bar is the fastest of them, never one outside
    :data:`~benchmarks.head_to_head.FAST`, and never a compiled partition, which this benchmark prices
    by an unfused op-by-op model (:func:`~benchmarks.head_to_head.modelled`)."""
    point = lambda peak, ratio, method="torch_checkpoint_sequential": h.Point(  # noqa: E731
        "n", 1, 1, method, "", "pytorch", peak, ratio, ratio, None)
    slow, fast, outside = point(1_335_489_108, 1.294), point(1_335_504_468, 1.166), point(1_000_000_000, 1.31)
    assert h.smallest_fast([slow, fast, outside, point(1_400_000_000, 1.0)]) is fast
    assert h.smallest_fast([slow, point(1_400_000_000, 1.0)]) is slow and h.smallest_fast([outside]) is None
    compiled = point(900_000_000, 1.0, "min_cut")
    assert h.smallest_fast([slow, compiled]) is slow and h.smallest_fast([compiled]) is None
    assert "[unfused op-by-op model]" in h.label(compiled)


def test_equal_times_summed_in_another_order_are_equal():
    """A partition that runs the same ops as PyTorch's (moved, not repeated) has the same predicted time
    up to the summation order's rounding: it is as fast, not slower."""
    costs = [0.1, 0.2, 0.3]
    plain = sum(costs)
    theirs = h.Point("n", 1, 1, "min_cut", "budget 1", "pytorch", 100, sum(costs[::-1]), sum(costs[::-1]) / plain, None)
    ours = h.Point("n", 1, 1, "vanilla+remat 0", "", "ours", 90, sum(costs), sum(costs) / plain, None)
    assert ours.time_ratio > theirs.time_ratio  # the rounding the comparison must see through
    assert h.best_at([ours], ratio=theirs.time_ratio) is ours
    slower = h.Point("n", 1, 1, "approxdp_tc", "", "ours", 80, 0.6, 1.0 + 1e-7, None)
    assert h.best_at([slower], ratio=theirs.time_ratio) is None


def test_the_report_names_the_commit_of_each_networks_points(tmp_path):
    old = h.Point("a", 1, 1, "vanilla", "", "ours", 100, 1.0, 1.0, None, commit="abc1234")
    new = h.Point("b", 1, 1, "vanilla", "", "ours", 100, 1.0, 1.0, None, commit="def5678")
    h.save([old], tmp_path)
    assert h.load("a", tmp_path)[0].commit == "abc1234"  # kept in the JSON, read back
    assert h.provenance({"a": [old], "b": [new]}) == "commit abc1234: a; commit def5678: b"


def test_the_extrapolation_check_compares_each_op_kind_with_the_probes():
    from benchmarks import extrapolation

    calls = {b: module_calls(h._capture("chain", b, 16).joint) for b in (*h.PROBES, 8)}
    rows = extrapolation.compare(calls, [8], top=2)
    assert [r[:2] for r in rows][0] == [8, "all"] and len(rows) == 3
    assert float(rows[0][2]) >= max(float(r[2]) for r in rows[1:]) and all(float(r[4]) > 0 for r in rows)


def test_each_allocator_regime_runs_in_a_process_started_with_its_setting(monkeypatch):
    import os

    from benchmarks import extrapolation

    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")  # restored after the test: in_process sets it here too
    for _, env, _, _ in extrapolation.REGIMES.values():
        assert extrapolation.in_process(env, os.getenv, "THP_MEM_ALLOC_ENABLE") == env["THP_MEM_ALLOC_ENABLE"]
    assert h.HUGE_PAGES in [env for _, env, _, _ in extrapolation.REGIMES.values()]  # the head-to-head's is checked


def test_the_refined_plan_at_the_bars_time_is_the_smallest_fast_enough():
    """``refined``: the memory-centric plan refined at its own peak where that saves recomputation,
    and, at the bar's time, the bisected plan of smallest peak that is fast enough; none where even
    the most refined is not."""
    model, inputs = h.nets.build("resblock", batch_size=2, input_size=32, seed=0)
    # without the ops' CPU scratch, which differs from CPU to CPU (oneDNN's), so the peaks are the host's own
    g = h.recompute.trace(model, inputs, workspaces=False)
    tc, mc = (h.recompute.plan(g, "approxdp", strategy=s) for s in ("tc", "mc"))
    assert h.refined(g, tc, mc, lambda p: False) == []  # at its own peak no set fits (tests/test_refine.py)
    [(method, knob, p)] = h.refined(g, tc, mc, lambda p: p.overhead < mc.overhead)
    assert (method, knob) == ("approxdp_mc refined", "at the bar's time")
    assert p.overhead < mc.overhead and h.step_peak(g, p.lower_sets) > h.step_peak(g, mc.lower_sets)


@pytest.mark.parametrize("module, args, named", [
    ("head_to_head", ["--budgets", "-3"], "argument --budgets: '-3' is not an integer from 1 up"),  # ran at paper scale
    ("head_to_head", ["--jobs", "0"], "argument --jobs: '0' is not an integer from 1 up"),  # a traceback of the pool
    ("head_to_head", ["--enough", "nan"], "argument --enough: 'nan' is not a number above 0"),
    ("head_to_head_cuda", ["--budgets", "1.5"], "argument --budgets: '1.5' is not a number from 0 to 1"),
    ("head_to_head_cuda", ["--remat", "0.25", "-1"], "argument --remat: '-1' is not a number from 0 up, nor 'off'"),
    ("compiled_memory", ["--budgets", "-0.5"], "argument --budgets: '-0.5' is not a number from 0 to 1"),
    ("measured", ["--steps", "0"], "argument --steps: '0' is not an integer from 1 up"),
    ("milp", ["--time-limit", "0"], "argument --time-limit: '0' is not a number above 0"),
    ("corpus", ["--jobs", "0"], "argument --jobs: '0' is not an integer from 1 up"),
    ("cpu_time", ["--rounds", "4", "--iterations", "3"], "--rounds 4 is more than --iterations 3"),
])
def test_a_benchmark_refuses_a_bad_count_before_any_work(monkeypatch, capsys, module, args, named):
    """A usage error (argparse's, exit status 2) that names the argument, the value and what it takes."""
    monkeypatch.setattr(sys, "argv", [f"{module}.py", *args])
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"benchmarks.{module}").main()
    assert info.value.code == 2 and named in capsys.readouterr().err
