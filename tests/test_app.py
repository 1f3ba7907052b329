"""Tests of the experiment app: Hydra configs compose and validate, multiruns store one record per
config and one offline W&B run per job, re-runs skip, OOM/infeasible are recorded outcomes, and the
SLURM launcher path runs through submitit's local executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

import recompute
from experiments import config, results, runner
from recompute import nets

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
NETS = sorted(p.stem for p in (CONF / "net").glob("*.yaml"))
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
PAPER_NETS = ["resnet50", "resnet152", "vgg19", "densenet161", "googlenet", "unet", "pspnet"]


def _compose(overrides: list[str], hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra_cfg)


def _experiment(tmp_path: Path, *overrides: str) -> config.AppConfig:
    """A validated config outside a Hydra run (its ``${hydra:...}`` paths replaced by tmp ones)."""
    cfg = _compose([f"results_dir={tmp_path / 'results'}", f"logger.dir={tmp_path}", "logger=none", *overrides])
    return config.to_experiment(cfg)


def _error_text(overrides: list[str]) -> str:
    with pytest.raises(HydraException) as info:
        _compose(overrides)
    return f"{info.value} {info.value.__cause__ or ''}"


# --------------------------------------------------------------------------- configs


def test_config_groups_cover_the_zoo_and_the_methods():
    assert set(NETS) == set(nets.names())
    assert set(PAPER_NETS) <= set(NETS)
    assert set(METHODS) == {"vanilla", "chen", "chen_greedy", "exhaustive",
                            "exactdp_tc", "exactdp_mc", "approxdp_tc", "approxdp_mc", "reforward", "reforward_linear"}


@pytest.mark.parametrize("net", NETS)
def test_every_net_and_method_composes(tmp_path, net):
    spec = nets.spec(net)
    for method in METHODS:
        exp = _experiment(tmp_path, f"net={net}", f"method={method}")
        assert exp.net.name == net and exp.method.name == method
        assert exp.method.planner.value in recompute.methods()
        # the net group carries the registry's defaults, and batch/size default to them
        assert (exp.batch_size, exp.input_size) == (spec.batch_size, spec.input_size[0])


def test_overrides_are_typed_and_keyed(tmp_path):
    exp = _experiment(tmp_path, "net=chain", "batch_size=7", "budget_gb=0.5", "device=cpu", "timing.batch_size=2")
    assert (exp.batch_size, exp.input_size, exp.budget_gb, exp.timing.batch_size) == (7, 16, 0.5, 2)
    same = _experiment(tmp_path / "other", "net=chain", "batch_size=7", "budget_gb=0.5", "device=cpu", "timing.batch_size=2")
    # the key is the experiment, not where it is stored or logged
    assert config.experiment_key(exp) == config.experiment_key(same)
    assert config.experiment_key(exp) != config.experiment_key(_experiment(tmp_path, "net=chain", "batch_size=8"))


def test_bad_key_names_the_key():
    text = _error_text(["batch_sise=3"])
    assert "batch_sise" in text and "not in" in text


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("device=gpu", ["auto", "cuda", "cpu", "fake"]),
        ("net.name=resnet51", ["resnet50", "pspnet", "chain"]),
        ("method.planner=approx", ["approxdp", "exactdp", "chen"]),
        ("net=resnet51", ["resnet50", "pspnet", "chain"]),
        ("method=approxdp", ["approxdp_tc", "approxdp_mc"]),
    ],
)
def test_bad_value_lists_the_allowed_values(override, allowed):
    text = _error_text([override])
    assert override.split("=")[1] in text
    assert all(a in text for a in allowed), text


def test_bad_type_and_range_are_named(tmp_path):
    assert "batch_size" in _error_text(["batch_size=abc"])
    with pytest.raises(ValueError, match="batch_size must be positive"):
        _experiment(tmp_path, "net=chain", "batch_size=0")


def test_cli_reports_a_bad_value():
    out = subprocess.run([sys.executable, "run.py", "device=gpu"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "Invalid value 'gpu'" in out.stderr and "fake" in out.stderr


def test_sweep_presets_compose():
    table1 = _compose(["experiment=table1"], hydra_cfg=True)
    params = table1.hydra.sweeper.params
    assert params.net.split(",") == PAPER_NETS
    assert params.method.split(",") == ["vanilla", "chen", "approxdp_mc", "approxdp_tc", "exactdp_mc", "exactdp_tc"]
    assert table1.device == "fake"
    for net in PAPER_NETS:
        fig4 = _compose([f"experiment=figure4/{net}"], hydra_cfg=True)
        assert fig4.net.name == net and fig4.logger.group == "figure4"
        assert fig4.hydra.sweeper.params.method.split(",") == ["vanilla", "chen", "approxdp_tc", "approxdp_mc"]
        assert len(str(fig4.hydra.sweeper.params.batch_size).split(",")) >= 5


def test_launcher_presets_compose():
    slurm = _compose(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], hydra_cfg=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher")
    assert (slurm.partition, slurm.gpus_per_node) == ("gpu", 1)
    assert slurm.timeout_min > 0 and slurm.mem_gb > 0 and len(slurm.setup) > 0
    local = _compose(["hydra/launcher=local"], hydra_cfg=True).hydra.launcher
    assert local._target_.endswith("JoblibLauncher") and local.n_jobs == 2


# --------------------------------------------------------------------------- one run in process


def test_record_fields(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=skip", "method=approxdp_tc", "timing.backend=cpu", "iterations=1"))
    assert rec["status"] == "ok", rec["error"]
    assert (rec["memory_backend"], rec["time_backend"]) == ("fake", "cpu")
    assert rec["num_nodes"] > 0 and rec["predicted_peak_bytes"] > 0
    assert rec["measured_peak_bytes"] > rec["param_bytes"] > 0
    assert rec["reduction"] == pytest.approx(1 - rec["measured_peak_bytes"] / rec["vanilla_peak_bytes"])
    assert 0 <= rec["overhead_fraction"] <= 1
    assert rec["seconds_per_iter"] > 0 and rec["vanilla_seconds_per_iter"] > 0
    assert rec["time_overhead"] == pytest.approx(rec["seconds_per_iter"] / rec["vanilla_seconds_per_iter"] - 1)
    json.dumps(rec)  # the record is plain JSON
    assert "skip" in runner.summary(rec) and "fake" in runner.summary(rec)


def test_infeasible_budget_is_recorded(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=approxdp_mc", "budget_gb=1e-9"))
    assert rec["status"] == "infeasible" and rec["min_budget"] > 0


def test_real_oom_is_recorded(tmp_path, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(recompute, "measure", oom)
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=chen"))
    assert rec["status"] == "oom" and rec["vanilla_status"] == "oom"
    assert "out of memory" in rec["error"]


def test_store_is_atomic_and_loads_into_pandas(tmp_path):
    for i in range(3):
        results.save({"key": f"k{i}", "net": "chain", "method": "chen", "batch_size": i + 1, "status": "ok"}, tmp_path)
    results.save({"key": "k0", "net": "chain", "method": "chen", "batch_size": 9, "status": "oom"}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k0.json", "k1.json", "k2.json"]  # no temp files left
    df = results.load(tmp_path)
    assert len(df) == 3 and results.find(tmp_path, "k0")["status"] == "oom"
    assert results.max_batch(df).loc["chain", "chen"] == 3


# --------------------------------------------------------------------------- real multiruns


def _multirun(tmp_path: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb_home")}
    cmd = [sys.executable, "run.py", "-m", f"results_dir={tmp_path / 'results'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", "logger.mode=offline", *overrides]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _records(tmp_path: Path) -> list[dict]:
    return results.load(tmp_path / "results").to_dict("records")


def _wandb_runs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "sweep").glob("*/wandb/offline-run-*"))


def test_multirun_records_and_wandb_runs_then_rerun_skips(tmp_path):
    sweep = ["net=chain,skip", "method=vanilla,approxdp_tc"]
    _multirun(tmp_path, *sweep)
    recs = _records(tmp_path)
    assert len(recs) == 4 and {r["status"] for r in recs} == {"ok"}
    assert {(r["net"], r["method"]) for r in recs} == {(n, m) for n in ("chain", "skip") for m in ("vanilla", "approxdp_tc")}
    assert len(_wandb_runs(tmp_path)) == 4
    assert len({r["group"] for r in recs}) == 1  # grouped by sweep
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").glob("*.json")}

    out = _multirun(tmp_path, *sweep)
    assert out.stdout.count("skipped") == 4
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "results").glob("*.json")} == stamps
    assert len(_wandb_runs(tmp_path)) == 4


def test_simulated_oom_is_recorded_and_the_sweep_finishes(tmp_path):
    # a 1 KiB device: chain's vanilla step exceeds it, so both configs are OOM outcomes
    _multirun(tmp_path, "net=chain", "method=vanilla,chen", "device_memory_gb=1e-6", "logger=none")
    recs = _records(tmp_path)
    assert len(recs) == 2 and {r["status"] for r in recs} == {"oom"}
    assert all("device_memory_gb" in r["error"] for r in recs)


def test_joblib_launcher(tmp_path):
    _multirun(tmp_path, "hydra/launcher=local", "net=chain,dropout", "method=chen", "logger=none")
    assert sorted(r["net"] for r in _records(tmp_path)) == ["chain", "dropout"]


def test_submitit_local_launcher(tmp_path):
    # the SLURM path (submitit pickles the job and runs it in a fresh process) without a cluster
    _multirun(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5",
              "net=chain", "method=approxdp_mc")
    recs = _records(tmp_path)
    assert len(recs) == 1 and recs[0]["status"] == "ok"
    assert len(_wandb_runs(tmp_path)) == 1
