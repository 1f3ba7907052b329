"""The CUDA benchmarks (``benchmarks.head_to_head_cuda``, ``benchmarks.simulator --backend cuda``,
``benchmarks.cuda_workspace``, ``scripts/cuda_checks.sh``): a clear refusal without a GPU; on one, each
runs on a tiny network."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from benchmarks import compiled_memory, cuda_workspace
from benchmarks import head_to_head_cuda as h
from benchmarks import simulator
from benchmarks.common import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: nothing to refuse")
def test_refuses_without_cuda():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        h.main(["--nets", "resnet50"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        simulator.main(["--backend", "cuda", "--nets", "resblock"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        cuda_workspace.main(["--nets", "resblock"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        compiled_memory.main(["--nets", "vgg19"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: nothing to refuse")
def test_cuda_checks_script_refuses_without_cuda(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/cuda_checks.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr
    assert not any((tmp_path / "out").iterdir())  # refused before any stage


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_method_runs_on_cuda():
    grid = h.Grid(budgets=(0.5, 1.0), solvers=("dp",), ours=2, remat=(None, 0.0))
    points = h.run_net("resblock", iterations=1, batch=4, size=16, grid=grid)
    assert not [p for p in points if p.status.startswith("failed")]
    assert {p.family for p in points} == {"ours", "pytorch"}
    assert any(p.method == "min_cut" for p in points) and any("+remat" in p.method for p in points)
    assert any(p.method.startswith("executor") and p.status == "ok" for p in points)
    ran = [p for p in points if p.status == "ok"]
    assert ran and all(p.peak > 0 and p.seconds > 0 for p in ran)
    assert next(p for p in points if p.method == "vanilla").status == "ok"
    assert "vanilla" in h.net_table(points)


def test_the_eager_methods_and_our_executors_plans_run_on_the_cpu_as_on_the_gpu():
    points = h.run_net("resblock", iterations=1, batch=2, size=16, grid=h.Grid(compiled=False), backend="cpu")
    assert [p.status for p in points if p.status != "ok"] == [] and all(p.device == "cpu" for p in points)
    assert not any(p.method == "min_cut" or "+remat" in p.method for p in points)
    ours = {p.method: p for p in points if p.method.startswith("executor")}
    assert {"executor vanilla", "executor approxdp_tc", "executor approxdp_mc", "executor chen"} <= set(ours)
    assert all(p.exact and p.family == "ours" and p.peak > 0 and p.seconds > 0 for p in ours.values())
    assert all(p.predicted == p.peak for p in ours.values())  # the simulator is the CPU step's allocator
    vanilla = next(p for p in points if p.method == "vanilla")
    assert ours["executor approxdp_mc"].peak < vanilla.peak
    assert {p.method for p in points if p.family == "pytorch"} == {m for m, _ in h.EAGER_BASELINES}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_without_transients_the_cuda_peak_is_the_simulated_one():
    for b in cuda_workspace.run("resblock", ["vanilla", "approxdp_tc"], batch=4, size=16):
        # the allocator rounds each block up to 512 bytes: a few hundred tensors stay under 1 MiB
        assert b.simulated <= b.steady <= b.simulated + 2**20, b
        assert b.steady <= b.measured and b.transients, b


def test_report_names_what_measured_each_network(tmp_path):
    kept = h.load("resnet50")  # the committed points, measured on a GPU
    assert kept and kept[0].made_by and kept[0].device
    (tmp_path / "cuda_pareto_vgg19.json").write_text("[]")  # an empty run is no network
    assert h.load("vgg19", tmp_path) is None and h.load("unet", tmp_path) is None
    mine = [h.CudaPoint("vgg19", 2, 32, "vanilla", "", "ours", None, None, "some GPU", True, "oom", "`cmd`, commit x")]
    text = h.report({"resnet50": kept, "vgg19": mine})
    assert text.index("**resnet50**") < text.index("**vgg19**")
    assert kept[0].made_by in text and "`cmd`, commit x" in text and "oom" in text
    # an --eager run keeps the compiled points of an earlier run: the table names both commands
    compiled = h.CudaPoint("vgg19", 2, 32, "min_cut", "budget 0.5, dp", "pytorch", 1, 1.0, "some GPU", False,
                           made_by="`cmd --budgets 0.5`, commit y")
    assert h.provenance(mine + [compiled]) == "`cmd`, commit x; compiled points: `cmd --budgets 0.5`, commit y"
    assert h.provenance(mine) == "`cmd`, commit x"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_memory_runs_on_cuda():
    rows = compiled_memory.run_net("resblock", [0.5])
    assert [r[2] for r in rows] == ["op by op", "inductor", "op by op", "inductor"]
    assert all(float(r[3]) <= float(r[4]) for r in rows)  # workspaces only add
