"""``benchmarks/pytorch.py`` (ours beside PyTorch's checkpointing, peak vs time) on a tiny net, so that
the script behind docs/benchmarks.md and paper_figures/pareto_<net>.png keeps running."""

from __future__ import annotations

from benchmarks import pytorch


def test_one_net_yields_rows_a_verdict_and_a_figure(tmp_path):
    methods = ["eager", "approxdp_tc", "torch_checkpoint_blocks"]
    points = pytorch.run_net("resblock", 2, 16, methods, budgets=2, iterations=1, warmup=0)
    assert len(points) == pytorch.variant_count(methods, 2) == 4
    assert [p.family for p in points] == ["eager", "ours", "ours", "pytorch"]
    assert all(p.peak and p.full_peak and p.seconds for p in points)
    assert all(p.full_peak >= p.peak and p.full_peak >= p.grad_bytes > 0 for p in points)
    assert points[1].knob.startswith("budget min") and points[1].exact == "bitwise"
    assert points[3].exact.startswith("differs")  # BatchNorm statistics updated again when recomputed
    assert points[0].label in pytorch.net_table(points) and "torch_checkpoint_blocks" in pytorch.net_table(points)
    for metric in ("peak", "full_peak"):
        row = pytorch.verdict(points, metric)
        assert row[0] == "resblock" and len(row) == len(pytorch.VERDICT_HEADERS)
        assert row[-1] == f"{points[0].grad_bytes / 2**20:.1f}"  # the gradients' floor beside it
    assert "Whole peak" in pytorch.report({"resnet50": points})
    pytorch.figure(points, tmp_path / "pareto_resblock.png")
    assert (tmp_path / "pareto_resblock.png").stat().st_size > 10_000
    pytorch.save(points, tmp_path)
    assert pytorch.load("resblock", tmp_path) == points and pytorch.load("vgg19", tmp_path) is None


def test_a_plan_past_the_recomputation_cap_is_listed_not_run():
    points = pytorch.run_net("resblock", 2, 16, ["eager", "approxdp_mc"], budgets=1, iterations=1, warmup=0,
                             max_overhead=0.0)
    assert points[1].peak is None and points[1].exact.startswith("not run: recomputes")
    assert pytorch.verdict(points)[1:6] == ["—"] * 5 and "not run" in pytorch.net_table(points)
