"""The experiment app under faults: every failure is recorded or reported with what to do, with the right
exit status, and nothing already measured or stored is lost.

Out of memory on any device is an outcome a restarted sweep skips; an unreadable file in the store is
skipped with a warning and its config run again (the file kept aside); a restarted sweep keeps its group; W&B without network and an
unwritable store never throw a run away (a store that fails its write keeps the record in a place the
error names); ``exhaustive`` refuses a graph too large for it; a ``kill -9``
of a joblib sweep leaves no worker behind that would go on writing records.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.plugins import Plugins
from hydra_plugins import recompute_sweeper
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from omegaconf import OmegaConf

import recompute
from experiments import config, record, results, runner, tracking
from experiments.record import RecordWarning, RunRecord, Status

from .cli import run_py

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "paper_figures_results"


def _experiment(tmp_path: Path, *overrides: str) -> config.AppConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"results_dir={tmp_path / 'results'}", f"logger.dir={tmp_path}",
                                           "logger=none", *overrides])
    return config.to_experiment(cfg)


def _run_py_in_a_new_process(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python run.py`` (``-m`` when asked) in a new interpreter, with the store and outputs under ``tmp_path``:
    for what outlives one run in this process (W&B's service, a sweep restarted). One run: :func:`tests.cli.run_py`."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb_home"),
           **(env or {})}
    dirs = [f"results_dir={tmp_path / 'results'}", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.run.dir={tmp_path / 'run'}"]
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]  # after the defaults: the last override of a key wins
    return subprocess.run([sys.executable, "run.py", *flags, *dirs, *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- 1. out of memory, any device


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 41104179200 bytes. Error code 12 (Cannot allocate memory)"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: you tried to "
                 "allocate 41104179200 bytes."),
    MemoryError(),
], ids=["cuda", "cpu-linux", "cpu-windows", "python"])
def test_out_of_memory_is_an_outcome(tmp_path, monkeypatch, error):
    def oom(*args, **kwargs):
        raise error

    monkeypatch.setattr(recompute, "measure", oom)
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=chen", "device=cpu"))
    assert (rec.status, rec.vanilla_status) == (Status.oom, Status.oom)
    assert rec.error == (str(error).splitlines()[0] if str(error) else "MemoryError")


def test_other_runtime_errors_stay_errors(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(recompute, "measure", broken)
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=chen", "device=cpu"))
    assert rec.status == Status.error and "shapes cannot be multiplied" in rec.error


def test_a_run_that_fails_is_stored_exits_non_zero_and_runs_again(tmp_path, monkeypatch):
    # run.py as the user runs it, with a bug planted in the library
    def bug(*args, **kwargs):
        raise RuntimeError("a bug in measure")

    monkeypatch.setattr(recompute, "measure", bug)
    for attempt in range(2):  # an error is no outcome: a rerun runs it again
        out = run_py("net=chain", "method=chen", "logger=none", f"results_dir={tmp_path / 'results'}",
                     f"hydra.run.dir={tmp_path / 'run'}")
        assert out.returncode == 1, out.stderr[-3000:]
        assert "failed with status=error" in out.stderr and "a bug in measure" in out.stderr
        assert "skipped" not in out.stdout
    (rec,) = map(record.read, (tmp_path / "results").glob("*.json"))
    assert rec.status == Status.error and "a bug in measure" in rec.error


# --------------------------------------------------------------------------- 2. store faults

GOOD = RunRecord(key="feedfacefeedface", net="chain", method="chen", batch_size=4).to_dict()
FAULTS: dict[str, bytes | None] = {
    "empty": b"",
    "truncated": json.dumps(GOOD).encode()[:40],
    "binary": b"\x80\x81\xfe\xff",
    "array": b"[1, 2, 3]",
    "no_key": json.dumps({"net": "chain", "status": "ok"}).encode(),
    "bad_status": json.dumps({**GOOD, "status": "done"}).encode(),
    "newer_schema": json.dumps({**GOOD, "schema_version": record.SCHEMA_VERSION + 1}).encode(),
    "renamed": json.dumps({**GOOD, "key": "0123456789abcdef"}).encode(),
    "directory": None,  # a folder named like a record
}


def _plant(path: Path, fault: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    content = FAULTS[fault]
    if content is None:
        path.mkdir()
        (path / "inside").write_text("x")
    else:
        path.write_bytes(content)


def _store_with_fault(tmp_path: Path, fault: str) -> tuple[Path, Path]:
    store = tmp_path / "results"
    for i in range(2):
        results.save(RunRecord(key=f"good{i}", net="chain", method="chen", batch_size=i + 1), store)
    bad = store / "feedfacefeedface.json"
    _plant(bad, fault)
    return store, bad


@pytest.mark.parametrize("fault", FAULTS)
def test_an_unreadable_file_is_skipped_with_a_warning_naming_it(tmp_path, fault):
    store, bad = _store_with_fault(tmp_path, fault)
    with pytest.warns(RecordWarning, match=re.escape(str(bad))) as caught:
        df = results.load(store)
    assert sorted(df["key"]) == ["good0", "good1"]
    assert "runs it again" in str(caught[0].message)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_sweep_runs_the_config_of_an_unreadable_file_again_and_keeps_the_file(tmp_path, fault):
    exp = _experiment(tmp_path, "net=chain", "method=chen")
    bad = results.record_path(exp.results_dir, config.experiment_key(exp))
    _plant(bad, fault)
    rec, ran = runner.run(exp, name="chain-chen", group=None, wandb_config={})
    assert ran and rec.status == Status.ok and results.find(exp.results_dir, rec.key) == rec
    aside = [p for p in Path(exp.results_dir).iterdir() if p.name.startswith(f"{bad.name}.unreadable-")]
    assert len(aside) == 1
    if FAULTS[fault] is not None:
        assert aside[0].read_bytes() == FAULTS[fault]  # set aside, not lost


def test_the_cli_reads_past_unreadable_files(tmp_path):
    store = tmp_path / "results"
    results.save(RunRecord(key="good0", net="chain", method="chen", batch_size=1), store)
    for i, fault in enumerate(FAULTS):
        _plant(store / f"bad{i:02d}.json", fault)
    out = subprocess.run([sys.executable, "-m", "experiments.results", str(store)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "chain" in out.stdout
    assert all(f"bad{i:02d}.json" in out.stderr for i in range(len(FAULTS))), out.stderr
    missing = subprocess.run([sys.executable, "-m", "experiments.results", str(tmp_path / "nowhere")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no results store at" in missing.stderr


# --------------------------------------------------------------------------- typed records


def test_a_record_round_trips_and_old_records_still_load(tmp_path):
    rec = runner.measure_experiment(_experiment(tmp_path, "net=chain", "method=approxdp_tc"))
    assert record.read(results.save(rec, tmp_path)) == rec
    old = results.find(FIXTURE, "f88859ad3a5e8691")  # schema 1: no schema_version, no timing keys
    assert old.schema_version == 1 and old.seconds_per_iter is None and old.status == Status.ok
    df = results.load(FIXTURE)
    assert set(df["schema_version"]) == {1} and list(df.columns) == list(record.FIELDS)


def test_unknown_keys_are_dropped_with_a_warning():
    with pytest.warns(RecordWarning, match="dropped keys this schema does not know: colour"):
        rec = RunRecord.from_dict({**GOOD, "colour": "red"}, "test")
    assert rec == RunRecord.from_dict(GOOD, "test")


def test_an_empty_store_has_every_column(tmp_path):
    df = results.load(tmp_path)
    assert df.empty and list(df.columns) == list(record.FIELDS)


# --------------------------------------------------------------------------- 3. W&B and the store never lose a run


def test_online_without_network_logs_offline_at_once(tmp_path):
    start = time.perf_counter()
    out = _run_py_in_a_new_process(tmp_path, "net=chain", "method=chen", "logger.mode=online", env={"WANDB_BASE_URL": "http://127.0.0.1:9"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert time.perf_counter() - start < 90  # wandb.init alone waited ~100 s
    log = out.stdout + out.stderr  # Hydra logs to stdout
    assert "W&B server http://127.0.0.1:9 not reachable" in log and "logged offline" in log
    assert len(list((tmp_path / "results").glob("*.json"))) == 1
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


def test_reachable_gives_up_after_its_timeout(monkeypatch):
    assert not tracking.reachable("http://127.0.0.1:9", timeout=5)  # a closed port: at once
    monkeypatch.setattr(tracking, "urlopen", lambda url, timeout: time.sleep(30))  # a server that never answers
    start = time.perf_counter()
    assert not tracking.reachable("https://api.wandb.ai", timeout=0.5)
    assert time.perf_counter() - start < 2


def test_wandb_that_cannot_start_loses_nothing(tmp_path, monkeypatch, caplog):
    import wandb

    def no_wandb(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", no_wandb)
    exp = _experiment(tmp_path, "net=chain", "method=chen", "logger.mode=offline")
    rec, ran = runner.run(exp, name="chain-chen", group=None, wandb_config={})
    assert ran and rec.status == Status.ok and results.find(exp.results_dir, rec.key) == rec
    assert "not logged to W&B" in caplog.text and "api_key not configured" in caplog.text


def test_an_unwritable_results_dir_is_reported_before_the_run(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    out = run_py("net=chain", f"results_dir={blocker / 'results'}", "logger=none", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 1
    assert f"results_dir={blocker / 'results'} is inside {blocker}, which is a file" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert "trace done" not in out.stdout + out.stderr  # nothing ran

    # the same check guards runner.run for callers that build the config themselves (max_batch)
    exp = _experiment(tmp_path, "net=chain", "method=chen")
    exp.results_dir = str(blocker / "results")
    monkeypatch.setattr(runner, "measure_experiment", lambda exp: pytest.fail("ran before checking the store"))
    with pytest.raises(results.StoreError, match="which is a file, not a directory"):
        runner.run(exp, name="chain-chen", group=None, wandb_config={})


def _fail_the_store_after_the_run(monkeypatch, exp: config.AppConfig, fault: str) -> list[RunRecord]:
    """Let the run finish, then make the store fail its write: ``read-only`` (chmod, as a user would),
    ``denied`` (the same as root sees it: creating the temp file in the store is refused) or ``enospc``
    (the disk fills: the temp file's fsync fails once, the fallback's succeeds)."""
    measured: list[RunRecord] = []
    measure = runner.measure_experiment

    def run_then_fail(exp: config.AppConfig) -> RunRecord:
        measured.append(measure(exp))
        if fault == "read-only":
            os.chmod(exp.results_dir, 0o555)
        elif fault == "denied":
            mkstemp = tempfile.mkstemp

            def refused(dir: str, **kwargs) -> tuple[int, str]:
                if Path(dir) == Path(exp.results_dir):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), dir)
                return mkstemp(dir=dir, **kwargs)

            monkeypatch.setattr(record.tempfile, "mkstemp", refused)
        else:
            real_fsync = os.fsync
            faults = [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))]

            def fsync(fd: int) -> None:
                if faults:
                    raise faults.pop()
                real_fsync(fd)

            monkeypatch.setattr(record.os, "fsync", fsync)
        return measured[-1]

    monkeypatch.setattr(runner, "measure_experiment", run_then_fail)
    return measured


@pytest.mark.parametrize("fault", [
    pytest.param("read-only", marks=pytest.mark.skipif(os.geteuid() == 0, reason="chmod does not stop root")),
    "denied", "enospc",
])
def test_a_store_that_fails_its_write_keeps_the_record_where_it_says(tmp_path, monkeypatch, fault):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # unsaved_dir() is under $TMPDIR
    exp = _experiment(tmp_path, "net=chain", "method=chen")
    store = Path(exp.results_dir)
    results.save(RunRecord(key="feedfacefeedface", net="chain", method="chen", batch_size=4), store)
    before = {p.name: p.read_bytes() for p in store.iterdir()}
    measured = _fail_the_store_after_the_run(monkeypatch, exp, fault)
    try:
        with pytest.raises(results.StoreError) as info:
            runner.run(exp, name="chain-chen", group=None, wandb_config={})
        assert {p.name: p.read_bytes() for p in store.iterdir()} == before  # intact: no temp file, no half record
    finally:
        os.chmod(store, 0o755)
    kept = tmp_path / "tmp" / "recompute-unsaved" / f"{measured[0].key}.json"
    assert record.read(kept) == measured[0]  # the finished run, whole
    message = str(info.value)
    assert str(results.record_path(store, measured[0].key)) in message and f"kept at {kept}" in message
    assert f"mv {kept} " in message


def _fill_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A full disk under the store ``tmp_path / "results"``, not under ``$TMPDIR`` (``tmp_path / "tmp"``): the
    folder where a record it could not take is kept."""
    write = record.write

    def full(rec, path):
        if Path(path).parent == tmp_path / "results":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(rec, path)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(record, "write", full)
    return tmp_path / "tmp" / "recompute-unsaved"


def test_run_py_names_where_an_unstored_record_is_kept(tmp_path, monkeypatch):
    # run.py as the user runs it, on a disk that fills while the run measures
    unsaved = _fill_the_store(tmp_path, monkeypatch)
    out = run_py("net=chain", "method=chen", "logger=none", f"results_dir={tmp_path / 'results'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 1, out.stderr[-3000:]
    (kept,) = unsaved.glob("*.json")
    assert "No space left on device" in out.stderr and f"kept at {kept}" in out.stderr
    assert "Traceback" not in out.stderr and record.read(kept).status == Status.ok
    assert not list((tmp_path / "results").iterdir())


def test_a_sweep_names_every_record_it_could_not_store(tmp_path, monkeypatch):
    # a disk full for the whole sweep: both jobs' records kept aside, and both named (Hydra names a batch's first failure)
    unsaved = _fill_the_store(tmp_path, monkeypatch)
    out = run_py("-m", "net=chain,skip", "method=chen", "logger=none", f"results_dir={tmp_path / 'results'}",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    kept = sorted(unsaved.glob("*.json"))
    assert len(kept) == 2 and "2 records could not be stored" in out.stderr
    for path in kept:
        assert f"kept at {path}" in out.stderr and f"mv {path} {tmp_path / 'results' / path.name}" in out.stderr


# --------------------------------------------------------------------------- 4. exhaustive on a large graph


def test_exhaustive_refuses_a_large_graph_as_an_outcome(tmp_path):
    exp = _experiment(tmp_path, "net=chain", "method=exhaustive_tc")  # #V = 17 > max_nodes = 16
    rec, ran = runner.run(exp, name="chain-exhaustive", group=None, wandb_config={})
    assert ran and rec.status == Status.too_large
    assert "max_nodes=16" in rec.error and "exactdp or approxdp" in rec.error
    assert runner.run(exp, name="chain-exhaustive", group=None, wandb_config={})[1] is False  # not run again


# --------------------------------------------------------------------------- 5. a restarted sweep


def _wandb_runs(sweep_dir: Path) -> list[Path]:
    return sorted(sweep_dir.glob("*/wandb/offline-run-*"))


def test_a_restarted_sweep_keeps_one_group_and_redoes_only_what_is_missing(tmp_path):
    # a multirun of two jobs, each stored and logged to W&B (offline); on the CPU, the second at a size
    # whose first allocation fails at once (the vgg19 batch 3200): an out-of-memory run is an
    # outcome, stored, and a restart does not run it again
    sweep = ["-m", "net=chain", "device=cpu", "input_size=16,200000", "iterations=1", "warmup=0", "logger.mode=offline"]
    first = _run_py_in_a_new_process(tmp_path, *sweep, f"hydra.sweep.dir={tmp_path / 'sweep-1'}")
    assert first.returncode == 0, first.stderr[-3000:]
    runs = {record.read(p).input_size: (p, record.read(p)) for p in (tmp_path / "results").glob("*.json")}
    assert runs[16][1].status == Status.ok
    assert runs[200000][1].status == Status.oom and "DefaultCPUAllocator" in runs[200000][1].error
    assert len(_wandb_runs(tmp_path / "sweep-1")) == 2
    done, killed = runs[200000][0], runs[16][0]
    killed.unlink()  # its job was killed (kill -9) before its record was written
    stamp = done.stat().st_mtime_ns

    # the same command again; a new timestamped sweep dir, as Hydra gives a restart
    again = _run_py_in_a_new_process(tmp_path, *sweep, f"hydra.sweep.dir={tmp_path / 'sweep-2'}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped") == 1 and done.stat().st_mtime_ns == stamp  # finished runs not redone
    assert killed.exists() and len(_wandb_runs(tmp_path / "sweep-2")) == 1  # a skipped job logs no W&B run
    (group,) = {record.read(p).group for p in (tmp_path / "results").glob("*.json")}
    assert group.startswith("sweep-")

    # another sweep (other overrides) is another group
    saved = OmegaConf.load(tmp_path / "sweep-2" / "multirun.yaml")
    saved.hydra.overrides.task = ["net=chain", "method=chen,vanilla", "logger=none"]
    (tmp_path / "sweep-3").mkdir()
    OmegaConf.save(saved, tmp_path / "sweep-3" / "multirun.yaml")
    hc = OmegaConf.create({"runtime": {"cwd": str(ROOT)}, "sweep": {"dir": str(tmp_path / "sweep-3")}})
    other = tracking.sweep_group(hc)
    assert other.startswith("sweep-") and other != group


# --------------------------------------------------------------------------- 6. kill -9 of a sweep: its jobs end too


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_kill_9_of_a_joblib_sweep_leaves_no_worker_writing_records(tmp_path):
    # four jobs that would each run for minutes, two at a time in loky workers
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=local", "net=chain,skip,dropout,resblock", "method=chen",
           "device=cpu", "iterations=200000", "logger=none", f"results_dir={tmp_path / 'results'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    sweep = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list((tmp_path / "sweep").glob("*/.hydra"))) < 2:
            time.sleep(0.5)  # each job writes its .hydra folder when a worker starts it
        workers = [c.pid for c in psutil.Process(sweep.pid).children() if "popen_loky" in " ".join(c.cmdline())]
        assert len(workers) == 2, "the jobs did not start in two loky workers"
        time.sleep(2)
        sweep.kill()  # SIGKILL: no cleanup in the sweep process
        sweep.wait()
        deadline = time.monotonic() + 15
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(workers), "loky workers outlived the sweep"
        assert not list((tmp_path / "results").glob("*.json"))
    finally:
        for pid in [sweep.pid, *_alive(workers)]:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_submitit_local_jobs_are_told_the_sweep_they_end_with(monkeypatch):
    """submitit starts each local job under a controller of its own, no child of the sweep, so the app's
    sweeper puts the sweep's process id in the jobs' environment (the kill -9 of such a sweep, as the
    joblib one above, takes a quarter of a minute: its hook-up and the job's side are tested apart)."""
    monkeypatch.delenv(runner.SWEEP_PID, raising=False)
    monkeypatch.setattr(Plugins.instance(), "instantiate_launcher", lambda **_: submitit_launcher.LocalLauncher())
    recompute_sweeper.Sweeper(max_batch_size=None).setup(hydra_context=None, task_function=None, config=OmegaConf.create())
    assert os.environ[runner.SWEEP_PID] == str(os.getpid())


def test_a_job_ends_when_the_sweep_its_environment_names_dies():
    sweep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    watch = "from experiments import runner; runner.exit_with_sweep(0.05); print('watching', flush=True); input()"
    job = subprocess.Popen([sys.executable, "-c", watch], cwd=ROOT, env={**os.environ, runner.SWEEP_PID: str(sweep.pid)},
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline() == "watching\n"
        sweep.kill()  # SIGKILL: no cleanup in the sweep process
        sweep.wait()
        assert job.wait(timeout=15) == 1, "the job outlived its sweep"
    finally:
        for process in (sweep, job):
            process.kill()
            process.wait()
