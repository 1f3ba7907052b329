"""Tests of the experiment app: Hydra configs compose and validate, a config mistake exits before any
work, OOM/infeasible are recorded outcomes, multiruns under the joblib launcher store one record per
config, and the SLURM launcher path runs through submitit's local executor (one offline W&B run per
job). A restarted sweep, which skips what it finished: tests/test_faults.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException

import recompute
from recompute.rewrites import pipeline
from experiments import config, results, runner
from experiments.record import RunRecord, Status
from recompute.doors import baselines
from experiments import nets
from recompute.planners.registry import spec as planner_spec

from .cli import run_py

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
METHODS = sorted(m.name for m in config.method_configs())
PAPER_NETS = nets.names(paper_only=True)
FIXTURE = ROOT / "tests" / "fixtures" / "paper_figures_results"


def _compose(overrides: list[str], hydra_cfg: bool = False):
    """The composed config, in the caller's ``initialize_config_dir`` where there is one (a test that
    composes many pays Hydra's set-up once)."""
    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=overrides, return_hydra_config=hydra_cfg)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra_cfg)


def _experiment(tmp_path: Path, *overrides: str) -> config.AppConfig:
    """A validated config outside a Hydra run (its ``${hydra:...}`` paths replaced by tmp ones)."""
    cfg = _compose([f"results_dir={tmp_path / 'results'}", f"logger.dir={tmp_path}", "logger=none", *overrides])
    return config.to_experiment(cfg, overrides)


def _error_text(overrides: list[str]) -> str:
    with pytest.raises(HydraException) as info:
        _compose(overrides)
    return f"{info.value} {info.value.__cause__ or ''}"


# --------------------------------------------------------------------------- configs


def test_config_groups_cover_the_zoo_and_the_methods():
    # the groups are registered from experiments.nets and the planner registries, the one list of each
    assert not (CONF / "net").exists() and not (CONF / "method").exists()
    assert set(METHODS) == {"auto", "vanilla", "chen", "chen_greedy", "exhaustive_tc", "exhaustive_mc",
                            "exactdp_tc", "exactdp_mc", "approxdp_tc", "approxdp_mc", "reforward", "reforward_linear",
                            "revolve", "chen_recursive", "join_dp", "milp", "torch_checkpoint_sequential",
                            "torch_checkpoint_blocks", "torch_sac", "torch_compile_budget"}


@pytest.mark.parametrize("net", nets.names())
def test_every_net_and_method_composes(tmp_path, net):
    spec = nets.spec(net)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for method in METHODS:
            exp = _experiment(tmp_path, f"net={net}", f"method={method}")
            assert exp.net.name == net and exp.method.name == method
            assert exp.method.planner in [*recompute.methods(), *baselines.names()]
            # the net group carries the registry's defaults, and batch/size default to them
            assert (exp.batch_size, exp.input_size) == (spec.batch_size, spec.input_size[0])


def test_overrides_are_typed_and_keyed(tmp_path):
    exp = _experiment(tmp_path, "net=chain", "batch_size=7", "budget_gb=0.5", "device=cpu", "timing.batch_size=2")
    assert (exp.batch_size, exp.input_size, exp.budget_gb, exp.timing.batch_size) == (7, 16, 0.5, 2)
    same = _experiment(tmp_path / "other", "net=chain", "batch_size=7", "budget_gb=0.5", "device=cpu", "timing.batch_size=2")
    # the key is the experiment, not where it is stored or logged
    assert config.experiment_key(exp) == config.experiment_key(same)
    assert config.experiment_key(exp) != config.experiment_key(_experiment(tmp_path, "net=chain", "batch_size=8"))


# Every config key with a bad value: (override, what the message must name: key, value, what is allowed).
# Hydra and OmegaConf reject these while composing (types, closed sets, unknown keys and options) ...
COMPOSE_MISTAKES = [
    ("batch_sise=3", ["batch_sise", "not in 'AppConfig'"]),
    ("net=resnet51", ["net/resnet51", "resnet50", "pspnet", "chain"]),
    ("net.name=resnet51", ["net.name", "resnet51", "resnet50", "chain"]),
    ("net.batch_size=abc", ["net.batch_size", "abc", "Integer"]),
    ("net.input_size=abc", ["net.input_size", "abc", "Integer"]),
    ("method=approxdp", ["method/approxdp", "approxdp_tc", "approxdp_mc"]),
    ("method.strategy=xc", ["method.strategy", "xc", "tc, mc"]),
    ("method.options=5", ["method.options", "int", "Dict"]),
    ("logger=wandbb", ["logger/wandbb", "none", "wandb"]),
    ("logger.mode=onlin", ["logger.mode", "onlin", "offline, online, disabled"]),
    ("logger.tags=5", ["logger.tags", "int", "list"]),
    ("timing.backend=gpu", ["timing.backend", "gpu", "auto, none, cpu, cuda"]),
    ("timing.batch_size=abc", ["timing.batch_size", "abc", "Integer"]),
    ("timing.input_size=abc", ["timing.input_size", "abc", "Integer"]),
    ("batch_size=abc", ["batch_size", "abc", "Integer"]),
    ("input_size=abc", ["input_size", "abc", "Integer"]),
    ("device=gpu", ["device", "gpu", "auto, cuda, cpu, fake"]),
    ("cost_model=flop", ["cost_model", "flop", "paper, flops, measured"]),
    ("memory_model=live", ["memory_model", "live", "paper, liveness"]),
    ("budget_gb=abc", ["budget_gb", "abc", "Float"]),
    ("device_memory_gb=abc", ["device_memory_gb", "abc", "Float"]),
    ("iterations=1.5", ["iterations", "1.5", "Integer"]),
    ("warmup=abc", ["warmup", "abc", "Integer"]),
    ("seed=abc", ["seed", "abc", "Integer"]),
    ("results_dir=[1]", ["results_dir", "[1]", "string"]),
    ("skip_existing=maybe", ["skip_existing", "maybe", "bool"]),
    ("experiment=table2", ["experiment/table2", "table1", "figure4"]),
    ("hydra/launcher=localx", ["hydra/launcher/localx", "local", "slurm"]),
]
# ... and to_experiment rejects what types cannot say, every mistake in one message, before any work.
CHECK_MISTAKES = [
    ("batch_size=0", ["batch_size=0: must be positive"]),
    ("input_size=-1", ["input_size=-1: must be positive"]),
    ("net.batch_size=0", ["net.batch_size=0: must be positive"]),
    ("net.input_size=0", ["net.input_size=0: must be positive"]),
    ("timing.batch_size=0", ["timing.batch_size=0: must be positive"]),
    ("timing.input_size=-3", ["timing.input_size=-3: must be positive"]),
    ("iterations=0", ["iterations=0: must be positive"]),
    ("warmup=-1", ["warmup=-1: must be 0 or more"]),
    ("budget_gb=0", ["budget_gb=0.0: must be positive"]),
    ("device_memory_gb=-1", ["device_memory_gb=-1.0: must be positive"]),
    ("device=cuda", ["device=cuda: no CUDA device", "allowed here: auto, cpu, fake"]),
    ("timing.backend=cuda", ["timing.backend=cuda: no CUDA device", "allowed here: auto, none, cpu"]),
    ("method.planner=approx", ["method.planner", "unknown method 'approx'", "approxdp", "exactdp", "chen"]),
    ("+method.options.memroy_model=paper", ["method.options", "no option 'memroy_model'", "max_lower_sets, time_levels, memory_model"]),
    ("method.options.time_levels=many", ["method.options", "time_levels='many'", "expected type int"]),
    ("+method.options.memory_model=lively", ["method.options", "memory_model='lively'", "paper, liveness"]),
    ("method.options.time_levels=0", ["method.options", "time_levels=0", "must be a positive integer"]),
    # a key the schema lacks, added with '+' (struct mode refuses it without): named with the nearest keys
    ("+budget_g=1", ["+budget_g=1: the config has no key 'budget_g'", "did you mean budget_gb?", "budget_gb=1"]),
    ("+net.batchsize=3", ["no key 'net.batchsize'", "did you mean net.batch_size", "net.batch_size=3"]),
    ("+timing.backnd=cpu", ["no key 'timing.backnd'", "did you mean timing.backend", "timing.backend=cpu"]),
    ("+colour=red", ["no key 'colour'", "the keys here are net, method", "budget_gb"]),
    # numbers that pass the type check but no range: nan, inf, below one byte, beyond what torch takes
    ("budget_gb=nan", ["budget_gb=nan: must be positive and finite", "from 2**-30 (one byte) up"]),
    ("budget_gb=inf", ["budget_gb=inf: must be positive and finite"]),
    ("budget_gb=1e-12", ["budget_gb=1e-12: must be positive and finite", "from 2**-30 (one byte) up"]),
    ("device_memory_gb=nan", ["device_memory_gb=nan: must be positive and finite"]),
    ("device_memory_gb=-inf", ["device_memory_gb=-inf: must be positive and finite"]),
    ("batch_size=9223372036854775808", ["batch_size=9223372036854775808: must be positive", "from 1 to 2**63-1"]),
    ("seed=18446744073709551616", ["seed=18446744073709551616", "from -2**63 to 2**64-1"]),
    ("method=torch_compile_budget method.options.budget_fraction=nan", ["method.options.budget_fraction=nan: must be a finite number"]),
    # on/off keys given a number or a word: OmegaConf would read -1, 2 and yes as true, 0 as false
    ("method.in_place=-1", ["method.in_place=-1: not a boolean", "allowed: true, false"]),
    ("method.in_place=2", ["method.in_place=2: not a boolean", "allowed: true, false"]),
    ("method.recompute_late=yes", ["method.recompute_late=yes: not a boolean", "allowed: true, false"]),
    ("method.recompute_at_peak=1", ["method.recompute_at_peak=1: not a boolean", "allowed: true, false"]),
    ("method.split_convolutions=0", ["method.split_convolutions=0: not a boolean", "allowed: true, false"]),
    ("skip_existing=on", ["skip_existing=on: not a boolean", "allowed: true, false"]),
]


@pytest.mark.parametrize("override, named", COMPOSE_MISTAKES, ids=[o for o, _ in COMPOSE_MISTAKES])
def test_a_bad_value_is_named_while_composing(override, named):
    text = _error_text([override])
    assert all(n in text for n in named), text


@pytest.mark.parametrize("override, named", CHECK_MISTAKES, ids=[o for o, _ in CHECK_MISTAKES])
def test_a_bad_value_is_named_before_any_work(tmp_path, monkeypatch, override, named):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same message on a GPU machine
    with pytest.raises(config.ConfigError) as info:
        _experiment(tmp_path, "method=exactdp_tc", *override.split())
    assert all(n in str(info.value) for n in named), str(info.value)


def test_every_mistake_is_reported_at_once(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(config.ConfigError) as info:
        _experiment(tmp_path, "batch_size=0", "warmup=-2", f"results_dir={blocker}/results")
    assert [line.split("=")[0].strip() for line in str(info.value).splitlines()[1:]] == ["batch_size", "warmup", "results_dir"]


def test_a_results_dir_that_is_a_file_is_named_as_one(tmp_path):
    # not "fix its permissions": no permission makes a file a folder
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for results_dir, named in [(blocker, f"results_dir={blocker} is a file, not a directory"),
                               (blocker / "results", f"results_dir={blocker / 'results'} is inside {blocker}, which is a file")]:
        with pytest.raises(config.ConfigError) as info:
            _experiment(tmp_path, f"results_dir={results_dir}")
        assert named in str(info.value) and "permissions" not in str(info.value), str(info.value)


def test_an_unquoted_non_ascii_value_is_told_to_be_quoted(tmp_path):
    """Hydra's parser refuses it with its lexer's words (``LexerNoViableAltException``) and no hint."""
    store = tmp_path / "résultats"
    out = run_py(f"results_dir={store}", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", env={"WANDB_MODE": "disabled"})
    assert out.returncode == 1 and "Traceback" not in out.stderr and not store.exists()
    assert f"""quote it: 'results_dir="{store}"'""" in out.stderr, out.stderr
    assert _compose([f'results_dir="{store}"']).results_dir == str(store)  # as the quoted override reaches Hydra


@pytest.mark.parametrize("args", [
    ["device=gpu"],  # composing
    ["-m", "net=chain,skip", "device=cuda"],  # checking, in a sweep: every job fails fast
    ["method=exactdp_tc", "+method.options.memroy_model=paper"],
    ["+budget_g=1"],  # a misspelt key with the '+' Hydra suggests: refused, not a run without a budget
    ["method.in_place=2"],  # an on/off key given a number: read from the command line, not the composed config
], ids=["compose", "sweep-cuda", "planner-option", "added-key", "flag"])
def test_a_config_mistake_exits_non_zero_with_the_message_alone(tmp_path, monkeypatch, args):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same message on a GPU machine
    out = run_py(*args, "logger=none", f"results_dir={tmp_path / 'results'}", f"hydra.run.dir={tmp_path / 'run'}",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}", env={"WANDB_MODE": "disabled"})
    assert out.returncode == 1
    assert args[-1].split("=")[1] in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "trace done" not in out.stdout + out.stderr and not list((tmp_path / "results").glob("*.json"))


def test_sweep_presets_compose():
    table1 = _compose(["experiment=table1"], hydra_cfg=True)
    params = table1.hydra.sweeper.params
    assert params.net.split(",") == PAPER_NETS
    assert params.method.split(",") == ["vanilla", "chen", "approxdp_mc", "approxdp_tc", "exactdp_mc", "exactdp_tc",
                                        "revolve", "chen_recursive"]
    assert table1.device == "fake"
    fig4 = _compose(["experiment=figure4", "net=pspnet"], hydra_cfg=True)
    assert fig4.device == "cpu" and fig4.logger.group == "figure4" and fig4.iterations >= 5
    assert fig4.hydra.sweeper.params.method.split(",") == ["vanilla", "chen", "approxdp_tc", "approxdp_mc"]


def test_scripts_name_only_presets_that_exist():
    # one way per artefact: every experiment preset a script runs exists, and every preset is run by one
    used = {m for sh in (ROOT / "scripts").glob("*.sh") for m in re.findall(r"experiment=([\w/]+)", sh.read_text())}
    presets = {str(p.relative_to(CONF / "experiment").with_suffix("")) for p in (CONF / "experiment").rglob("*.yaml")}
    assert used == presets


def test_keys_of_stored_records_are_stable():
    # records written before the net group came from the registry keep their keys: a rerun skips them
    # (the fixture's vanilla and Chen records predate dropping memory_model from their key, so only DPs)
    for path in sorted(FIXTURE.glob("*.json")):
        c = results.find(FIXTURE, path.stem).config
        if not planner_spec(c["method"]["planner"]).simulator_default:
            continue
        flat = {"net": c["net"], "method": c["method"]["name"], **{f"timing.{k}": v for k, v in c["timing"].items()},
                **{k: v for k, v in c.items() if k not in ("net", "method", "timing")}}
        exp = _experiment(FIXTURE, *(f"{k}={v}" for k, v in flat.items() if v is not None))
        assert config.experiment_key(exp) == path.stem, path.name


def test_launcher_presets_compose():
    slurm = _compose(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], hydra_cfg=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher")
    assert (slurm.partition, slurm.gpus_per_node) == ("gpu", 1)
    assert slurm.timeout_min > 0 and slurm.mem_gb > 0 and len(slurm.setup) > 0
    local = _compose(["hydra/launcher=local"], hydra_cfg=True).hydra
    assert local.launcher._target_.endswith("JoblibLauncher") and local.launcher.n_jobs == 2
    assert local.sweeper._target_ == "hydra_plugins.recompute_sweeper.Sweeper"  # the app's checks, on every launcher


@pytest.mark.parametrize("launcher", ["slurm", "submitit_slurm"])  # the app's preset, and submitit's own name
def test_slurm_without_slurm_is_refused_before_submitting(tmp_path, launcher):
    # PATH without sbatch/srun, as on a laptop
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if not any(Path(d, tool).exists() for tool in ("sbatch", "srun")))
    out = run_py("-m", f"hydra/launcher={launcher}", "net=chain", "method=chen", "logger=none",
                 f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                 env={"PATH": path, "WANDB_MODE": "disabled"})
    assert out.returncode == 1
    assert f"hydra/launcher={launcher} submits" in out.stderr and "sbatch and srun are not on PATH" in out.stderr, out.stderr
    assert "hydra/launcher=local" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not list(tmp_path.glob("sweep/.submitit")) and not (tmp_path / "results").exists()  # nothing submitted or run


# --------------------------------------------------------------------------- one run in process


def test_record_fields(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=skip", "method=approxdp_tc", "timing.backend=cpu", "iterations=1"))
    assert rec.status == Status.ok, rec.error
    assert (rec.memory_backend, rec.time_backend) == ("fake", "cpu")
    assert rec.num_nodes > 0 and rec.predicted_peak_bytes > 0
    assert rec.measured_peak_bytes > rec.param_bytes > 0
    assert rec.reduction == pytest.approx(1 - rec.measured_peak_bytes / rec.vanilla_peak_bytes)
    assert 0 <= rec.overhead_fraction <= 1
    assert rec.solve_seconds > 0 and rec.kernel_seconds > 0  # the kernels' load is apart from the solve
    assert rec.seconds_per_iter > 0 and rec.vanilla_seconds_per_iter > 0
    assert rec.time_overhead == pytest.approx(rec.seconds_per_iter / rec.vanilla_seconds_per_iter - 1)
    assert json.loads(json.dumps(rec.to_dict())) == rec.to_dict()  # the record is plain JSON
    assert "skip" in runner.summary(rec) and "fake" in runner.summary(rec)


def test_a_schedule_planner_runs_through_the_app(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=revolve"))
    assert rec.status == Status.ok, rec.error
    assert rec.measured_peak_bytes == rec.predicted_total_bytes < rec.vanilla_peak_bytes
    assert rec.slots >= 3 and rec.recomputations > 0 and "slots / recomputations" in runner.summary(rec)


def test_schedule_rewrites_are_method_options_of_their_own_experiments(tmp_path, monkeypatch):
    """``method.recompute_late=true`` plans with :func:`recompute.rewrites.pipeline.with_late_recompute`,
    ``method.recompute_at_peak=true`` then with :func:`~recompute.rewrites.pipeline.with_peak_recompute` and
    ``method.in_place=true`` then runs ops in place (:func:`~recompute.rewrites.pipeline.with_in_place`); the record
    names the method ``<name>+split conv+late+peak+in-place`` (``method.split_convolutions=true`` traces the
    step with its convolution backwards split) under a key of its own, and off, the key is the one
    records had before the options (``test_keys_of_stored_records_are_stable``). PyTorch's methods refuse them."""
    asked = []
    for rewrite in ("with_late_recompute", "with_peak_recompute", "with_in_place"):
        real = getattr(pipeline, rewrite)
        monkeypatch.setattr(pipeline, rewrite,
                            lambda p, g, real=real, rewrite=rewrite, **kw: asked.append(rewrite) or real(p, g, **kw))
    both = _experiment(tmp_path, "net=resblock", "method=approxdp_mc", "method.recompute_late=true",
                       "method.recompute_at_peak=true", "method.in_place=true", "method.split_convolutions=true")
    plain = _experiment(tmp_path, "net=resblock", "method=approxdp_mc")
    assert config.experiment_key(both) != config.experiment_key(plain)
    assert config.experiment_dict(plain)["method"].keys().isdisjoint(config.SCHEDULE_REWRITES)
    rec = runner.measure_experiment(both)
    assert rec.status == Status.ok, rec.error
    assert rec.method == "approxdp_mc+split conv+late+peak+in-place" and rec.config["method"]["in_place"]
    assert asked == ["with_late_recompute", "with_peak_recompute", "with_in_place"]
    assert rec.measured_peak_bytes == rec.predicted_total_bytes
    for flag in config.SCHEDULE_REWRITES:
        with pytest.raises(config.ConfigError, match=rf"method.{flag} \(torch_sac\).*allowed: false"):
            _experiment(tmp_path, "net=resblock", "method=torch_sac", f"method.{flag}=true")


@pytest.mark.parametrize("method", ["torch_checkpoint_sequential", "torch_checkpoint_blocks", "torch_sac",
                                    "torch_compile_budget"])
def test_a_pytorch_baseline_runs_through_the_app(tmp_path, method):
    """Measured on cpu with the same meter as the planners, its exactness recorded (BatchNorm statistics
    updated twice by the checkpoint variants' recomputation)."""
    rec = runner.measure_experiment(_experiment(
        tmp_path, "net=resblock", f"method={method}", "device=cpu", "batch_size=2", "input_size=16", "iterations=1",
        "warmup=0", *(["method.options.backend=aot_eager_decomp_partition"] if method == "torch_compile_budget" else [])))
    assert rec.status == Status.ok, rec.error
    assert rec.planner == method and rec.k is None and rec.predicted_peak_bytes is None  # no plan
    assert rec.measured_peak_bytes > rec.param_bytes > 0 and rec.seconds_per_iter > 0
    assert rec.exactness in ("bitwise", "close") if method == "torch_compile_budget" else rec.exactness.endswith("buffers")
    assert rec.exactness in runner.summary(rec)


def test_what_a_baseline_cannot_run_is_a_recorded_outcome(tmp_path):
    # torch.compile under FakeTensor; a net without residual/dense/inception blocks
    compiled = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=torch_compile_budget", "device=fake"))
    assert compiled.status == Status.unsupported
    assert "torch_compile_budget" in compiled.error and "'fake'" in compiled.error and "cpu" in compiled.error
    blockless = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=torch_checkpoint_blocks", "device=cpu"))
    assert blockless.status == Status.unsupported and "no block in Chain" in blockless.error


def test_exactness_of_a_plan_is_recorded(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=dropout", "method=chen", "device=cpu", "iterations=1"))
    assert rec.status == Status.ok and rec.exactness == "bitwise"


def test_infeasible_budget_is_recorded(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=approxdp_mc", "budget_gb=1e-9"))
    assert rec.status == Status.infeasible and rec.min_budget > 0


def test_store_is_atomic_and_loads_into_pandas(tmp_path):
    for i in range(3):
        results.save(RunRecord(key=f"k{i}", net="chain", method="chen", batch_size=i + 1), tmp_path)
    results.save(RunRecord(key="k0", net="chain", method="chen", batch_size=9, status=Status.oom), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k0.json", "k1.json", "k2.json"]  # no temp files left
    df = results.load(tmp_path)
    assert len(df) == 3 and results.find(tmp_path, "k0").status == Status.oom
    assert results.max_batch(df).loc["chain", "chen"] == 3


# --------------------------------------------------------------------------- real multiruns


def _multirun(tmp_path: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb_home")}
    # W&B offline unless the caller picks a logger (a value override would win over its group's mode)
    logger = [] if any(o.startswith("logger=") for o in overrides) else ["logger.mode=offline"]
    cmd = [sys.executable, "run.py", "-m", f"results_dir={tmp_path / 'results'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *logger, *overrides]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    return results.load(tmp_path / "results").to_dict("records")


def _wandb_runs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "sweep").glob("*/wandb/offline-run-*"))


def test_simulated_oom_is_recorded_and_the_sweep_finishes_under_the_joblib_launcher(tmp_path):
    # a 1 KiB device: chain's and dropout's steps exceed it, so every config is an OOM outcome; the jobs
    # run in the local preset's joblib workers, two at a time
    _multirun(tmp_path, "hydra/launcher=local", "net=chain,dropout", "method=chen", "device_memory_gb=1e-6",
              "logger=none")
    recs = _records(tmp_path)
    ran = sorted((r["net"], r["method"]) for r in recs)
    assert ran == [("chain", "chen"), ("dropout", "chen")]
    assert {r["status"] for r in recs} == {"oom"} and all("device_memory_gb" in r["error"] for r in recs)


def test_submitit_local_launcher(tmp_path):
    # the SLURM path (submitit pickles the job and runs it in a fresh process) without a cluster
    _multirun(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5",
              "net=chain", "method=approxdp_mc")
    recs = _records(tmp_path)
    assert len(recs) == 1 and recs[0]["status"] == "ok"
    assert len(_wandb_runs(tmp_path)) == 1
