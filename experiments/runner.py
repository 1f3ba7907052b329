"""Run one experiment config: build → trace → plan → measure vanilla and the method → one record.

Memory is measured on ``memory_backend(device)`` at the configured (batch, size); time on
``time_backend(...)``, reusing the memory measurements when both are the same real backend at the
same size, else with its own trace and plan at ``timing.batch_size``/``timing.input_size``.
A baseline of :mod:`recompute.doors.baselines` (PyTorch's own methods) has no plan: it is measured wrapped
around the model, with the same meter. On a real backend the method's step is compared with plain
training (:func:`recompute.doors.exactness.compare`: ``bitwise``, ``close`` or what differs).
Outcomes other than success (out of memory on any device, infeasible budget, a graph too large for the
planner, a baseline that cannot run this net or on this backend, any other error) are recorded with a :class:`~experiments.record.Status` instead of raised,
so a sweep goes on; the record is an :class:`~experiments.record.RunRecord`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import logging
import multiprocessing
import os
import platform
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import torch

import recompute
from experiments import kernels
from experiments import nets
from recompute.core.storage import state_bytes
from recompute.doors.baselines import Unsupported
from recompute.doors.exactness import compare
from recompute.doors.measure import default_loss
from recompute.pricing.memory_model import MemoryModel
from recompute.planners.registry import AUTO
from recompute.doors.auto import choose
from recompute.core.families import TooManyLowerSets
from recompute.planners.exhaustive import GraphTooLarge

from . import results
from .config import (GIB, SCHEDULE_REWRITES, AppConfig, cost_model, experiment_dict, experiment_key, is_baseline,
                     memory_backend, plan_options, time_backend, uses_memory_model)
from .record import RecordError, RunRecord, Status
from .tracking import wandb_run
from recompute.rewrites.pipeline import with_rewrites

__all__ = ["measure_experiment", "new_record", "run", "summary", "is_oom", "exit_with_sweep", "SWEEP_PID"]

log = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parents[1]
_sweep_watch: threading.Thread | None = None
# the sweep's process id, in the environment of the jobs of a launcher that starts them apart from the
# sweep's process tree (submitit_local: under submitit's controller; hydra_plugins.recompute_sweeper sets it)
SWEEP_PID = "RECOMPUTE_SWEEP_PID"


def exit_with_sweep(poll_seconds: float = 0.5) -> None:
    """In a job process of a sweep (a joblib/loky worker, a process pool, a submitit_local job), exit
    as soon as the sweep's process dies.

    Loky workers and submitit's local jobs outlive a ``kill -9`` (or a Ctrl-C to it alone) of the sweep
    and go on running the configs already queued to them, writing records nobody waits for; a daemon
    thread that sees the sweep's process gone ends the job at once. A record being written then is
    lost whole, never half (the store writes atomically). Jobs of the basic launcher run in the
    sweep's own process: no-op there.
    """
    global _sweep_watch
    sweep = _sweep_pid()
    if sweep is None or _sweep_watch is not None:
        return

    def watch() -> None:
        while _running(sweep):
            time.sleep(poll_seconds)
        log.error("the sweep process %s is gone: job process %s exits without finishing its job", sweep, os.getpid())
        os._exit(1)

    _sweep_watch = threading.Thread(target=watch, name="exit-with-sweep", daemon=True)
    _sweep_watch.start()


def _sweep_pid() -> int | None:
    """The sweep process this one runs jobs for: a pool worker's parent, or the one :data:`SWEEP_PID`
    names; None in the sweep's own process."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        return parent.pid
    pid = int(os.environ.get(SWEEP_PID, os.getpid()))
    return None if pid == os.getpid() else pid


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists: signal 0 is checked, not sent."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@functools.cache
def git_commit() -> str | None:
    """HEAD of the repo the app runs from (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _setup(exp: AppConfig, backend: str, batch: int, size: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model (real weights) and inputs on ``backend``; fake inputs allocate nothing at paper scale."""
    model, inputs = nets.build(
        exp.net.name.value, batch_size=batch, input_size=size, seed=exp.seed, fake_inputs=backend == "fake"
    )
    if backend == "cuda":
        model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    return model, inputs


def _traced_and_planned(exp: AppConfig, model: torch.nn.Module, inputs: tuple, budget: int | None,
                        where: str = "") -> tuple[recompute.Graph, recompute.Plan]:
    """The step traced with the loss ``measure`` applies (so that the plan's simulated peak is the
    measured one) and planned: by the planner with the rewrites asked for, or, for ``auto``, with the
    convolution splits it chooses (:func:`recompute.doors.auto.choose`)."""

    def trace_at(split: bool | frozenset[str]) -> recompute.Graph:
        return _timed(f"trace{where}", recompute.trace, model, inputs, cost_model=cost_model(exp), loss_fn=default_loss,
                      split_convolutions=split)

    if exp.method.planner == AUTO:
        return _timed(f"plan {exp.method.name}", choose, trace_at, budget=budget,
                      split_convolutions=exp.method.split_convolutions, **plan_options(exp))
    graph = trace_at(bool(exp.method.split_convolutions))
    # numba's once-per-process load of the planner's kernels, apart from its solve (recompute.kernels)
    strategy = exp.method.strategy.value if exp.method.strategy is not None else None
    plan = _timed(f"plan {exp.method.name}", recompute.plan, graph, exp.method.planner, strategy=strategy, budget=budget,
                  **plan_options(exp))
    return graph, with_rewrites(plan, graph, recompute_late=exp.method.recompute_late,
                                     recompute_at_peak=exp.method.recompute_at_peak, in_place=exp.method.in_place)


def _baseline(exp: AppConfig, model: torch.nn.Module) -> torch.nn.Module:
    """The model wrapped by the baseline ``exp`` names, with its options."""
    return recompute.optimize(model, method=exp.method.planner, **plan_options(exp))


def _recomputes_nothing(plan: recompute.Plan) -> bool:
    """A plan whose step is plain training's (vanilla's): one block, no schedule of its own."""
    return plan.schedule is None and not plan.recomputed()


def _check_exactness(exp: AppConfig, rec: RunRecord, model: torch.nn.Module, inputs: tuple, runner,
                     plan: recompute.Plan | None = None) -> None:  # fmt: skip
    """How one step of ``runner`` compares with plain training (a plan that recomputes nothing is it)."""
    if plan is None or not _recomputes_nothing(plan):
        rec.exactness = _timed(f"exactness of {exp.method.name}", compare, model, runner, inputs, seed=exp.seed).summary()


def _measure(exp: AppConfig, model, inputs, backend: str, runner=None, predicted: int | None = None) -> recompute.Measurement:
    return recompute.measure(
        model, inputs, runner=runner, backend=backend, iterations=exp.iterations, warmup=exp.warmup,
        predicted_peak=predicted,
    )


def _timed(label: str, fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    log.info("%s done in %.1fs", label, time.perf_counter() - start)
    return out


def _memory_stage(exp: AppConfig, rec: RunRecord, backend: str) -> tuple[recompute.Measurement | None, recompute.Measurement | None]:
    """Fill the memory fields of ``rec``; returns the (vanilla, method) measurements for reuse as timings."""
    model, inputs = _timed(f"build {exp.net.name.value} b={exp.batch_size} {exp.input_size}²", _setup, exp, backend, exp.batch_size, exp.input_size)
    cap = int(exp.device_memory_gb * GIB) if exp.device_memory_gb is not None else None

    try:
        vanilla = _timed("measure vanilla", _measure, exp, model, inputs, backend)
        rec.set_vanilla(vanilla, cap)
    except Exception as e:
        if not is_oom(e):
            raise
        _free(backend)  # the baseline not fitting is a result, not a failure of the run
        vanilla = None
        rec.set_vanilla_oom(e, state_bytes(model))

    if is_baseline(exp):
        # its graph (#V, #E, ...) is recorded as a planner's is: traced as it runs, not planned
        rec.set_graph(_timed("trace", recompute.trace, model, inputs, cost_model=cost_model(exp), loss_fn=default_loss))
        wrapped = _baseline(exp, model)
        method = _timed(f"measure {exp.method.name}", _measure, exp, model, inputs, backend, wrapped)
        rec.set_method(method, vanilla, cap)
        if backend != "fake":
            _check_exactness(exp, rec, model, inputs, wrapped)
        return vanilla, method

    rec.budget = int(exp.budget_gb * GIB) if exp.budget_gb is not None else None
    # numba's once-per-process load of the planner's kernels, apart from its solve (recompute.kernels)
    rec.kernel_seconds = _timed("load the planner's kernels", kernels.load, [exp.method.planner]).seconds
    graph, plan = _traced_and_planned(exp, model, inputs, rec.budget)
    rec.set_graph(graph)
    rec.set_plan(plan)
    if cap is not None and backend != "fake" and rec.predicted_total_bytes > cap:
        # on a real device, do not provoke the OOM the plan already predicts
        rec.end(Status.oom, f"predicted {rec.predicted_total_bytes} B > device_memory_gb cap {cap} B")
        return vanilla, None

    if _recomputes_nothing(plan) and vanilla is not None:
        method = vanilla  # the same step: measuring it twice would only cost time
    else:
        executor = recompute.execute(graph, plan)
        method = _timed(f"measure {exp.method.name}", _measure, exp, model, inputs, backend, executor, int(plan.peak))
        if backend != "fake":
            _check_exactness(exp, rec, model, inputs, executor, plan)
    rec.set_method(method, vanilla, cap)
    return vanilla, method


def _time_stage(exp: AppConfig, rec: RunRecord, backend: str, batch: int, size: int) -> tuple[recompute.Measurement, recompute.Measurement]:
    """Vanilla and method timings with their own trace and plan (a different backend or size); the
    exactness check where the memory backend had no values (``fake``)."""
    model, inputs = _setup(exp, backend, batch, size)
    if is_baseline(exp):
        wrapped = _baseline(exp, model)
        vanilla = _timed(f"time vanilla on {backend}", _measure, exp, model, inputs, backend)
        method = _timed(f"time {exp.method.name} on {backend}", _measure, exp, model, inputs, backend, wrapped)
        if rec.exactness is None:
            _check_exactness(exp, rec, model, inputs, wrapped)
        return vanilla, method
    # an explicit budget is for the memory-scale graph; at another size use the planner's smallest
    same_size = (batch, size) == (exp.batch_size, exp.input_size)
    graph, plan = _traced_and_planned(exp, model, inputs, rec.budget if same_size else None,
                                      f" for timing ({backend}, b={batch}, {size}²)")
    executor = recompute.execute(graph, plan)
    vanilla = _timed(f"time vanilla on {backend}", _measure, exp, model, inputs, backend)
    method = _timed(f"time {exp.method.name} on {backend}", _measure, exp, model, inputs, backend, executor)
    if rec.exactness is None:
        _check_exactness(exp, rec, model, inputs, executor, plan)
    return vanilla, method


def _free(backend: str) -> None:
    if backend == "cuda":
        torch.cuda.empty_cache()


# torch's CPU allocator raises a plain RuntimeError (c10::Error) when malloc fails, worded per platform
_CPU_OOM = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is an out-of-memory failure on any device: an outcome to record, not a bug."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _CPU_OOM)


def new_record(exp: AppConfig) -> RunRecord:
    """The record of ``exp`` before it runs: what runs, where, and with which code."""
    mem, tb = memory_backend(exp.device), time_backend(exp)
    return RunRecord(
        key=experiment_key(exp), net=exp.net.name.value,
        method=exp.method.name + "".join(SCHEDULE_REWRITES[flag] for flag in exp.method.rewrites()),
        planner=exp.method.planner, strategy=exp.method.strategy.value if exp.method.strategy else None,
        batch_size=exp.batch_size, input_size=exp.input_size, device=exp.device.value,
        memory_backend=mem, time_backend=tb,
        time_batch_size=(exp.timing.batch_size or exp.batch_size) if tb else None,
        time_input_size=(exp.timing.input_size or exp.input_size) if tb else None,
        cost_model=cost_model(exp), memory_model=exp.memory_model.value if uses_memory_model(exp) else None,
        seed=exp.seed, iterations=exp.iterations, warmup=exp.warmup,
        device_memory_bytes=int(exp.device_memory_gb * GIB) if exp.device_memory_gb is not None else None,
        config=experiment_dict(exp), git_commit=git_commit(), torch_version=torch.__version__,
        host=platform.node(), timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def measure_experiment(exp: AppConfig) -> RunRecord:
    """The record of one experiment (not stored, not logged). Never raises for an experiment outcome."""
    rec = new_record(exp)
    mem = rec.memory_backend
    start = time.perf_counter()
    try:
        vanilla, method = _memory_stage(exp, rec, mem)
        if rec.time_backend is not None and rec.status == Status.ok:
            t_batch, t_size = rec.time_batch_size, rec.time_input_size
            if rec.time_backend == mem and (t_batch, t_size) == (exp.batch_size, exp.input_size) and vanilla is not None:
                timings = vanilla, method
            else:
                timings = _time_stage(exp, rec, rec.time_backend, t_batch, t_size)
            rec.set_timing(*timings)
    except recompute.InfeasibleBudget as e:
        rec.end(Status.infeasible, e)
        rec.min_budget = e.min_budget
    except TooManyLowerSets as e:
        rec.end(Status.too_many_lower_sets, e)
    except GraphTooLarge as e:
        rec.end(Status.too_large, e)
    except Unsupported as e:
        rec.end(Status.unsupported, e)
    except Exception as e:  # noqa: BLE001 - a failing config is recorded and the sweep goes on
        if is_oom(e):
            _free(mem)
            rec.end(Status.oom, e)
        else:
            log.exception("%s × %s failed", rec.net, rec.method)
            rec.end(Status.error, f"{type(e).__name__}: {e}")
    rec.run_seconds = time.perf_counter() - start
    return rec


def run(exp: AppConfig, *, name: str, group: str | None, wandb_config: dict[str, Any]) -> tuple[RunRecord, bool]:
    """Run ``exp`` unless its record exists; store and log the record. Returns (record, ran).

    Records with ``status=error`` are run again: they are failures of the code, not results. So is a
    config whose stored file is unreadable; that file is moved aside first, not overwritten.
    :class:`~experiments.results.StoreError` when the store is not writable (before the run) or the
    record could not be written to it (after: the record is kept where the message says).
    """
    exit_with_sweep()
    results.check_writable(exp.results_dir)  # before the run, not after an hour of it
    key = experiment_key(exp)
    try:
        old = results.find(exp.results_dir, key) if exp.skip_existing else None
    except RecordError as e:
        log.warning("%s; moved it to %s and running %s again", e, results.set_aside(exp.results_dir, key), name)
        old = None
    if old is not None and old.status != Status.error:
        log.info("skip %s: record %s exists (status=%s)", name, key, old.status)
        return old, False
    with wandb_run(exp.logger, name=name, group=group, config=wandb_config) as wb:
        rec = measure_experiment(exp)
        rec.group = exp.logger.group or group
        if wb is not None:  # first: the W&B mirror has the record even when the store cannot take it
            wb.summary.update({k: v for k, v in rec.to_dict().items() if k != "config"})
        path = results.save(rec, exp.results_dir)
        stored = sum(1 for _ in Path(exp.results_dir).glob("*.json"))  # progress of a long sweep
        log.info("%s: status=%s in %.1fs, record %s (%d in the store)", name, rec.status, rec.run_seconds, path, stored)
    return rec, True


def _size(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / GIB:.3f} GiB" if b >= GIB else f"{b / 2**20:.3f} MiB"


# what the DP planners' search optimised, by memory model
_SEARCH = {MemoryModel.simulator: "its own block costs", MemoryModel.liveness: "liveness model",
           MemoryModel.paper: "eq. (2)"}


def summary(rec: RunRecord) -> str:
    """A short human table of one record, naming the backend behind each number."""
    mem, tb = rec.memory_backend, rec.time_backend
    untimed = f"not timed ({mem} has no clock; timing.backend=cpu timing.batch_size=... to time)"
    t_src = f"{tb}, b={rec.time_batch_size}, {rec.time_input_size}²" if tb else untimed
    sec = lambda s: "-" if s is None else f"{s:.4f} s"  # noqa: E731
    frac = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    ovh = rec.predicted_overhead
    rows = [
        ("#V / #E", f"{rec.num_nodes or '-'} / {rec.num_edges or '-'}", f"trace, cost model {rec.cost_model}"),
        ("budget", _size(rec.budget) if rec.budget else ("least peak within its time" if rec.planner == AUTO else
                                                          "smallest feasible" if rec.k else "-"), f"min {_size(rec.min_budget)}"),
        ("predicted peak (+params)", _size(rec.predicted_total_bytes),
         "simulator" + (f" (search: {_SEARCH[rec.memory_model]})" if rec.memory_model else "")),
        ("measured peak (+params)", _size(rec.measured_peak_bytes), mem),
        ("vanilla peak (+params)", _size(rec.vanilla_peak_bytes), f"{mem}, vanilla {rec.vanilla_status or '-'}"),
        ("memory reduction", frac(rec.reduction), mem),
        ("overhead predicted", "-" if ovh is None else f"{ovh} ({frac(rec.overhead_fraction)} of T(V))", "planner"),
        ("modelled step time", "-" if rec.predicted_time_ratio is None else f"{rec.predicted_time_ratio:.3f}× plain",
         f"cost model {rec.cost_model}"),
        ("time / iter (vanilla)", f"{sec(rec.seconds_per_iter)} ({sec(rec.vanilla_seconds_per_iter)})", t_src),
        ("overhead measured", frac(rec.time_overhead), t_src if tb else "-"),
        ("solve time", sec(rec.solve_seconds), f"planner; its kernels loaded first in {sec(rec.kernel_seconds)}"),
        ("vs plain training", rec.exactness or "not checked", "one step: loss, grads, buffers"),
    ]
    if rec.slots is not None:
        rows.insert(7, ("slots / recomputations", f"{rec.slots} / {rec.recomputations}", "schedule"))
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    head = (f"{rec.net} × {rec.method}  batch {rec.batch_size}, {rec.input_size}²  "
            f"status={rec.status}  key={rec.key}")
    lines = [head] + [f"  {q:<{width}}  {v:<{vwidth}}  [{s}]" for q, v, s in rows]
    if rec.error:
        lines.append(f"  error: {rec.error}")
    return "\n".join(lines)
