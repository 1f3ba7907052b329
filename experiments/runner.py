"""Run one experiment config: build → trace → plan → measure vanilla and the method → one record.

Memory is measured on ``memory_backend(device)`` at the configured (batch, size); time on
``time_backend(...)``, reusing the memory measurements when both are the same real backend at the
same size, else with its own trace and plan at ``timing.batch_size``/``timing.input_size``.
Outcomes other than success (OOM, infeasible budget, too many lower sets, any other error) are
recorded with a ``status`` instead of raised, so a sweep goes on.
"""

from __future__ import annotations

import datetime as _dt
import functools
import logging
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

import recompute
from recompute import nets
from recompute.planners.dp import TooManyLowerSets

from . import results
from .config import GIB, MEMORY_MODEL_PLANNERS, AppConfig, experiment_dict, experiment_key, memory_backend, time_backend
from .tracking import wandb_run

__all__ = ["measure_experiment", "run", "summary", "STATUSES"]

log = logging.getLogger(__name__)

STATUSES = ("ok", "oom", "infeasible", "too_many_lower_sets", "error")
_REPO = Path(__file__).resolve().parents[1]


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


def _plan(exp: AppConfig, graph: recompute.Graph, budget: int | None) -> recompute.Plan:
    strategy = exp.method.strategy.value if exp.method.strategy is not None else None
    options = dict(exp.method.options)
    if exp.method.planner.value in MEMORY_MODEL_PLANNERS:
        options.setdefault("memory_model", exp.memory_model.value)
    return recompute.plan(graph, exp.method.planner.value, strategy=strategy, budget=budget, **options)


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


def _memory_stage(exp: AppConfig, rec: dict[str, Any], backend: str) -> tuple[recompute.Measurement | None, recompute.Measurement | None]:
    """Fill the memory fields of ``rec``; returns the (vanilla, method) measurements for reuse as timings."""
    model, inputs = _timed(f"build {exp.net.name.value} b={exp.batch_size} {exp.input_size}²", _setup, exp, backend, exp.batch_size, exp.input_size)
    graph = _timed("trace", recompute.trace, model, inputs, cost_model=exp.cost_model.value)
    rec.update(num_nodes=graph.n, num_edges=graph.num_edges, total_cost=int(graph.total_time()),
               trace_seconds=graph.program.trace_seconds if graph.program is not None else None)
    cap = int(exp.device_memory_gb * GIB) if exp.device_memory_gb is not None else None

    try:
        vanilla = _timed("measure vanilla", _measure, exp, model, inputs, backend)
        rec.update(vanilla_peak_bytes=vanilla.total_peak_bytes, param_bytes=vanilla.param_bytes,
                   vanilla_status="oom" if cap is not None and vanilla.total_peak_bytes > cap else "ok")
    except torch.OutOfMemoryError as e:  # the baseline not fitting is a result, not a failure of the run
        _free(backend)
        vanilla = None
        params = [*model.parameters(), *model.buffers()]
        rec.update(vanilla_status="oom", vanilla_error=str(e).splitlines()[0],
                   param_bytes=sum(t.numel() * t.element_size() for t in params))

    budget = int(exp.budget_gb * GIB) if exp.budget_gb is not None else None
    rec["budget"] = budget
    plan = _timed(f"plan {exp.method.name}", _plan, exp, graph, budget)
    rec.update(
        k=plan.k, min_budget=plan.info.get("min_budget"), predicted_peak_bytes=int(plan.peak),
        predicted_total_bytes=int(plan.peak) + rec["param_bytes"], predicted_overhead=int(plan.overhead),
        overhead_fraction=plan.overhead / rec["total_cost"] if rec["total_cost"] else None,
        solve_seconds=plan.solve_seconds,
    )
    if cap is not None and backend != "fake" and rec["predicted_total_bytes"] > cap:
        # on a real device, do not provoke the OOM the plan already predicts
        rec.update(status="oom", error=f"predicted {rec['predicted_total_bytes']} B > device_memory_gb cap {cap} B")
        return vanilla, None

    if exp.method.planner.value == "vanilla" and vanilla is not None:
        method = vanilla  # the same step: measuring it twice would only cost time
    else:
        executor = recompute.execute(graph, plan)
        method = _timed(f"measure {exp.method.name}", _measure, exp, model, inputs, backend, executor, int(plan.peak))
    rec.update(measured_peak_bytes=method.total_peak_bytes, measured_activation_bytes=method.peak_bytes)
    if vanilla is not None:
        rec["reduction"] = 1 - method.total_peak_bytes / vanilla.total_peak_bytes
    if cap is not None and method.total_peak_bytes > cap:
        rec.update(status="oom", error=f"measured {method.total_peak_bytes} B > device_memory_gb cap {cap} B")
    return vanilla, method


def _time_stage(exp: AppConfig, rec: dict[str, Any], backend: str, batch: int, size: int) -> tuple[recompute.Measurement, recompute.Measurement]:
    """Vanilla and method timings with their own trace and plan (a different backend or size)."""
    model, inputs = _setup(exp, backend, batch, size)
    graph = _timed(f"trace for timing ({backend}, b={batch}, {size}²)", recompute.trace, model, inputs, cost_model=exp.cost_model.value)
    # an explicit budget is for the memory-scale graph; at another size use the planner's smallest
    same_size = (batch, size) == (exp.batch_size, exp.input_size)
    plan = _plan(exp, graph, rec["budget"] if same_size else None)
    vanilla = _timed(f"time vanilla on {backend}", _measure, exp, model, inputs, backend)
    method = _timed(f"time {exp.method.name} on {backend}", _measure, exp, model, inputs, backend, recompute.execute(graph, plan))
    return vanilla, method


def _free(backend: str) -> None:
    if backend == "cuda":
        torch.cuda.empty_cache()


def measure_experiment(exp: AppConfig) -> dict[str, Any]:
    """The record of one experiment (not stored, not logged). Never raises for an experiment outcome."""
    mem, tb = memory_backend(exp.device), time_backend(exp)
    t_batch = exp.timing.batch_size or exp.batch_size
    t_size = exp.timing.input_size or exp.input_size
    rec: dict[str, Any] = dict(
        key=experiment_key(exp), net=exp.net.name.value, method=exp.method.name,
        planner=exp.method.planner.value, strategy=exp.method.strategy.value if exp.method.strategy else None,
        batch_size=exp.batch_size, input_size=exp.input_size, device=exp.device.value,
        memory_backend=mem, time_backend=tb, time_batch_size=t_batch if tb else None,
        time_input_size=t_size if tb else None, cost_model=exp.cost_model.value,
        memory_model=exp.memory_model.value if exp.method.planner.value in MEMORY_MODEL_PLANNERS else None,
        seed=exp.seed,
        iterations=exp.iterations, warmup=exp.warmup,
        device_memory_bytes=int(exp.device_memory_gb * GIB) if exp.device_memory_gb is not None else None,
        budget=None, status="ok", error=None, git_commit=git_commit(), torch_version=torch.__version__,
        host=platform.node(), timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        config=experiment_dict(exp),
    )
    start = time.perf_counter()
    try:
        vanilla, method = _memory_stage(exp, rec, mem)
        if tb is not None and rec["status"] == "ok":
            if tb == mem and (t_batch, t_size) == (exp.batch_size, exp.input_size) and vanilla is not None:
                timings = vanilla, method
            else:
                timings = _time_stage(exp, rec, tb, t_batch, t_size)
            rec.update(vanilla_seconds_per_iter=timings[0].seconds, seconds_per_iter=timings[1].seconds,
                       time_overhead=timings[1].seconds / timings[0].seconds - 1)
    except recompute.InfeasibleBudget as e:
        rec.update(status="infeasible", error=str(e), min_budget=e.min_budget)
    except TooManyLowerSets as e:
        rec.update(status="too_many_lower_sets", error=str(e))
    except torch.OutOfMemoryError as e:
        _free(mem)
        rec.update(status="oom", error=str(e).splitlines()[0])
    except Exception as e:  # noqa: BLE001 - a failing config is recorded and the sweep goes on
        log.exception("%s × %s failed", rec["net"], rec["method"])
        rec.update(status="error", error=f"{type(e).__name__}: {e}")
    rec["run_seconds"] = time.perf_counter() - start
    return rec


def run(exp: AppConfig, *, name: str, group: str | None, wandb_config: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Run ``exp`` unless its record exists; store and log the record. Returns (record, ran).

    Records with ``status=error`` are run again: they are failures of the code, not results.
    """
    key = experiment_key(exp)
    old = results.find(exp.results_dir, key) if exp.skip_existing else None
    if old is not None and old["status"] != "error":
        log.info("skip %s: record %s exists (status=%s)", name, key, old["status"])
        return old, False
    with wandb_run(exp.logger, name=name, group=group, config=wandb_config) as wb:
        rec = measure_experiment(exp)
        rec["group"] = exp.logger.group or group
        path = results.save(rec, exp.results_dir)
        stored = sum(1 for _ in Path(exp.results_dir).glob("*.json"))  # progress of a long sweep
        log.info("%s: status=%s in %.1fs, record %s (%d in the store)", name, rec["status"], rec["run_seconds"], path, stored)
        if wb is not None:
            wb.summary.update({k: v for k, v in rec.items() if k != "config"})
    return rec, True


def _size(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / GIB:.3f} GiB" if b >= GIB else f"{b / 2**20:.3f} MiB"


def summary(rec: dict[str, Any]) -> str:
    """A short human table of one record, naming the backend behind each number."""
    mem, tb = rec["memory_backend"], rec.get("time_backend")
    untimed = f"not timed ({mem} has no clock; timing.backend=cpu timing.batch_size=... to time)"
    t_src = f"{tb}, b={rec.get('time_batch_size')}, {rec.get('time_input_size')}²" if tb else untimed
    sec = lambda s: "-" if s is None else f"{s:.4f} s"  # noqa: E731
    frac = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    ovh = rec.get("predicted_overhead")
    rows = [
        ("#V / #E", f"{rec.get('num_nodes', '-')} / {rec.get('num_edges', '-')}", f"trace, cost model {rec['cost_model']}"),
        ("budget", _size(rec.get("budget")) if rec.get("budget") else "smallest feasible", f"min {_size(rec.get('min_budget'))}"),
        ("predicted peak (+params)", _size(rec.get("predicted_total_bytes")),
         "liveness model" if rec.get("memory_model") == "liveness" else "eq. (2)"),
        ("measured peak (+params)", _size(rec.get("measured_peak_bytes")), mem),
        ("vanilla peak (+params)", _size(rec.get("vanilla_peak_bytes")), f"{mem}, vanilla {rec.get('vanilla_status', '-')}"),
        ("memory reduction", frac(rec.get("reduction")), mem),
        ("overhead predicted", "-" if ovh is None else f"{ovh} ({frac(rec.get('overhead_fraction'))} of T(V))", "planner"),
        ("time / iter (vanilla)", f"{sec(rec.get('seconds_per_iter'))} ({sec(rec.get('vanilla_seconds_per_iter'))})", t_src),
        ("overhead measured", frac(rec.get("time_overhead")), t_src if tb else "-"),
        ("solve time", sec(rec.get("solve_seconds")), "planner"),
    ]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    head = (f"{rec['net']} × {rec['method']}  batch {rec['batch_size']}, {rec['input_size']}²  "
            f"status={rec['status']}  key={rec['key']}")
    lines = [head] + [f"  {q:<{width}}  {v:<{vwidth}}  [{s}]" for q, v, s in rows]
    if rec.get("error"):
        lines.append(f"  error: {rec['error']}")
    return "\n".join(lines)
