"""``benchmarks.measured`` end to end on a small network, and what it relies on in PyTorch's methods:
selective checkpointing per block, and one compiled graph per budget in one process."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import recompute
from benchmarks import measured
from experiments import nets
from recompute.doors.baselines import blocks
from recompute.doors.exactness import compare
from recompute.doors.measure import default_loss

FAST = [m for m in measured.METHODS if not m.compiled and m.label in (
    "eager", "checkpoint per block", "SAC per block, compute-intensive saved", "ours", "approxdp-mc +in-place")]


def test_every_method_runs_is_metered_timed_and_judged(tmp_path, monkeypatch):
    monkeypatch.setitem(measured.SIZES, "resblock", measured.Size(4, 16, "a test net"))
    points = measured.run_net("resblock", steps=2, methods=FAST, commit="abc1234", progress=lambda line: None)
    assert [p.method for p in points] == [m.label for m in FAST]
    for p in points:
        assert p.status == "ok" and p.steps == 2 and len(p.times) == 2 and p.peak > 0
        assert p.peak_with_params > p.peak and p.seconds_spread == max(p.times) - min(p.times)
        assert p.commit == "abc1234" and "threads" in p.device
    exact = {p.method: p.exact for p in points}
    assert exact["eager"] == exact["ours"] == exact["approxdp-mc +in-place"] == "bitwise"
    assert exact["checkpoint per block"].startswith("differs")  # BatchNorm's statistics updated twice
    v = measured.verdict(points)
    assert v.default.method == "ours" and v.bar.family == "pytorch"
    assert v.bar.seconds <= measured.FAST * v.eager.seconds
    monkeypatch.setattr(measured, "RECORDS", tmp_path / "measured.json")
    measured.save(points)
    assert measured.load() == points
    text = measured.report(points, "header")
    assert "**resblock**, batch 4, 16 (a test net)" in text and "ours (default)" in text
    monkeypatch.setitem(measured.SIZES, "resblock", measured.Size(8, 16, "a larger batch"))
    assert "batch 4, 16 (recorded before this network's size became batch 8, 16)" in measured.report(points, "h")
    measured.figure(points, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 0


def test_a_method_that_does_not_apply_is_a_row_saying_why(monkeypatch):
    monkeypatch.setitem(measured.SIZES, "chain", measured.Size(2, 8, "a test net"))
    only = [m for m in measured.METHODS if m.label in ("eager", "checkpoint per block")]
    eager, blocks_point = measured.run_net("chain", steps=1, methods=only, progress=lambda line: None)
    assert eager.status == "ok" and blocks_point.status.startswith("NoBlocks") and blocks_point.peak is None


@pytest.mark.parametrize("name", ["resnet50", "gpt2", "vit_b_16", "mobilenet_v3_large"])
def test_selective_checkpointing_applies_per_block(name):
    model, inputs = nets.build(name, batch_size=2, input_size=32, seed=0,
                               **({"layers": 2, "vocab": 256} if name == "gpt2" else {}))
    assert blocks(model)
    plain = recompute.measure(model, inputs, backend="cpu", iterations=1)
    for policy in ("compute_intensive", "matmul"):
        sac = recompute.optimize(copy.deepcopy(model), method="torch_sac", policy=policy)
        got = recompute.measure(sac.model, inputs, runner=sac, backend="cpu", iterations=1)
        assert got.activation_peak_bytes < plain.activation_peak_bytes, policy
        assert compare(sac.model, sac, inputs).summary() in ("bitwise", "close") or name in ("resnet50", "mobilenet_v3_large")
    with pytest.raises(ValueError, match="policy='all'.*compute_intensive, matmul"):
        recompute.optimize(model, method="torch_sac", policy="all")


def test_two_budgets_compile_two_graphs_in_one_process():
    """Dynamo reuses a graph compiled for the same backend and the same module class: each
    torch_compile_budget module compiles under a backend of its own, or every budget would run the
    first one's partition."""
    torch._dynamo.reset()
    model, (x,) = nets.build("resblock", batch_size=4, input_size=16, seed=0)
    saved = []
    for budget in (1.0, 0.0):
        twin = measured._twin(model)
        m = recompute.optimize(twin, method="torch_compile_budget", budget_fraction=budget,
                               backend="aot_eager_decomp_partition")
        default_loss(m(x)).backward()  # compiles
        model.zero_grad(set_to_none=True)
        kept = []  # what the compiled forward saves for backward, activations and parameters alike
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.untyped_storage().nbytes()) or t,
                                                      lambda t: t):
            default_loss(m(x)).backward()
        model.zero_grad(set_to_none=True)
        saved.append(sum(kept))
    torch._dynamo.reset()
    assert saved[1] < saved[0]


def test_the_sizes_say_why_and_every_network_builds():
    for name, size in measured.SIZES.items():
        assert name in nets.names() and size.why and size.batch > 0
    assert {dataclasses.fields(measured.Point)[i].name for i in range(15)} >= {
        "network", "batch_size", "input_size", "method", "family", "default", "compiled", "peak", "peak_with_params",
        "seconds", "seconds_spread", "steps", "exact", "device", "commit"}


def test_a_wrapped_failure_is_recorded_by_its_cause():
    # dynamo's BackendCompilerFailed says only 'backend=... raised:' on its first line
    try:
        try:
            raise ValueError("the cause\nand more")
        except ValueError as inner:
            raise RuntimeError("backend='x' raised:\n") from inner
    except RuntimeError as e:
        assert measured._why(e) == "RuntimeError from ValueError: the cause"
    assert measured._why(TypeError("plain")) == "TypeError: plain"
