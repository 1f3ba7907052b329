"""One run of the experiment app as a typed record, and the only code that writes or reads it as JSON.

A :class:`RunRecord` says what ran (net, method, sizes, backends, the config), what it measured (graph,
plan, peaks, times) and how it ended (:class:`Status`). The runner fills it stage by stage through the
``set_*`` methods below; the results store (:mod:`experiments.results`) keeps one per experiment key
as ``<key>.json``, written by :func:`write` and read back by :func:`read`.

Schema versions (``schema_version``):

* 1 — the plain dict of earlier versions, without a ``schema_version`` key and without the keys a
  run never reached (e.g. no timings on ``fake``); the missing fields load as ``None``.
* 2 — every field of :class:`RunRecord`, always present.
* 3 — adds ``exactness`` (how the method's step compares with plain training) and the status
  ``unsupported``; a version-2 record loads with ``exactness=None``.
* 4 — adds every timed step (``iteration_seconds``, ``vanilla_iteration_seconds``).
* 5 — adds ``kernel_seconds``: the planner's compiled kernels loaded before the timed solve, so
  ``solve_seconds`` no longer holds numba's once-per-process load; older records load with ``None``.
* 6 — adds ``predicted_time_ratio``: the plan's modelled step time ÷ plain training's, where its
  planner priced it (``auto``); older records load with ``None``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, get_type_hints

if TYPE_CHECKING:  # the record only reads these; importing recompute here would load torch for nothing
    import recompute

__all__ = ["SCHEMA_VERSION", "Status", "RunRecord", "RecordError", "RecordWarning", "write", "read", "FIELDS", "NUMERIC_FIELDS",
           "load_artefact", "write_artefact", "artefact_main"]

SCHEMA_VERSION = 6


class Status(StrEnum):
    """How a run ended. Every status but ``error`` is an outcome: a restarted sweep skips it."""

    ok = "ok"
    oom = "oom"  # out of memory: a real allocator failed, or a device_memory_gb cap was exceeded
    infeasible = "infeasible"  # no plan fits the budget; min_budget says which would
    too_many_lower_sets = "too_many_lower_sets"  # exactdp's lower-set family passed max_lower_sets
    too_large = "too_large"  # the planner refuses a graph this size (exhaustive's max_nodes)
    unsupported = "unsupported"  # a baseline cannot run this net (no blocks) or on this backend (compile on fake)
    error = "error"  # a failure of the code, not a result: run again on restart


_STATUS_VALUES = tuple(s.value for s in Status)


class RecordError(ValueError):
    """A file or W&B summary that is not a readable run record; the message names it and why."""


class RecordWarning(UserWarning):
    """A record loaded, but with something dropped or skipped (the message says what)."""


@dataclass
class RunRecord:
    """The record of one experiment. Sizes are bytes, times seconds, fractions in [0, 1]."""

    # what ran
    key: str
    net: str
    method: str
    planner: str | None = None
    strategy: str | None = None
    batch_size: int | None = None
    input_size: int | None = None
    device: str | None = None
    memory_backend: str | None = None
    time_backend: str | None = None
    time_batch_size: int | None = None
    time_input_size: int | None = None
    cost_model: str | None = None
    memory_model: str | None = None  # None for planners without one (vanilla, chen)
    seed: int | None = None
    iterations: int | None = None
    warmup: int | None = None
    device_memory_bytes: int | None = None
    budget: int | None = None
    config: dict[str, Any] = field(default_factory=dict)  # experiments.config.experiment_dict
    # how it ended
    status: Status = Status.ok
    error: str | None = None
    run_seconds: float | None = None
    # provenance
    group: str | None = None
    git_commit: str | None = None
    torch_version: str | None = None
    host: str | None = None
    timestamp: str | None = None
    # the traced graph
    num_nodes: int | None = None
    num_edges: int | None = None
    total_cost: int | None = None
    trace_seconds: float | None = None
    # vanilla on the memory backend
    vanilla_status: Status | None = None
    vanilla_error: str | None = None
    vanilla_peak_bytes: int | None = None
    param_bytes: int | None = None
    # the plan
    k: int | None = None
    slots: int | None = None  # the slot count c of a schedule planner (revolve, join_dp, chen_recursive)
    recomputations: int | None = None  # op instances its schedule runs again
    min_budget: int | None = None
    predicted_peak_bytes: int | None = None
    predicted_total_bytes: int | None = None
    predicted_overhead: int | None = None
    overhead_fraction: float | None = None
    solve_seconds: float | None = None
    kernel_seconds: float | None = None  # loading the planner's compiled kernels before the solve (schema 5)
    predicted_time_ratio: float | None = None  # the modelled step time ÷ plain training's (auto; schema 6)
    # the method on the memory backend
    measured_peak_bytes: int | None = None
    measured_activation_bytes: int | None = None
    reduction: float | None = None
    exactness: str | None = None  # vs plain training: bitwise | close | "differs: ..." (None: not checked)
    # timings on the time backend
    vanilla_seconds_per_iter: float | None = None
    seconds_per_iter: float | None = None
    time_overhead: float | None = None
    vanilla_iteration_seconds: list[float] | None = None  # every timed step (schema 4): spread, not only the median
    iteration_seconds: list[float] | None = None
    schema_version: int = SCHEMA_VERSION

    # ------------------------------------------------------------------ filled by the runner

    def set_graph(self, graph: recompute.Graph) -> None:
        """#V, #E, T(V) and the trace time of the traced graph."""
        self.num_nodes, self.num_edges, self.total_cost = graph.n, graph.num_edges, int(graph.total_time())
        self.trace_seconds = graph.program.trace_seconds if graph.program is not None else None

    def set_vanilla(self, vanilla: recompute.Measurement, cap: int | None) -> None:
        """The baseline's peak and parameters; over ``cap`` bytes it would not have fitted the device."""
        self.vanilla_peak_bytes, self.param_bytes = vanilla.total_peak_bytes, vanilla.param_bytes
        self.vanilla_status = Status.oom if cap is not None and vanilla.total_peak_bytes > cap else Status.ok

    def set_vanilla_oom(self, error: BaseException, param_bytes: int) -> None:
        """The baseline did not fit: a result of the run, not its failure."""
        self.vanilla_status, self.vanilla_error, self.param_bytes = Status.oom, _first_line(error), param_bytes

    def set_plan(self, plan: recompute.Plan) -> None:
        """The planner's prediction (peak with parameters, overhead as a fraction of T(V)) and solve time."""
        self.k, self.min_budget, self.solve_seconds = plan.k, plan.min_budget, plan.solve_seconds
        self.predicted_time_ratio = plan.time_ratio
        if plan.schedule is not None:
            self.slots, self.recomputations = plan.slots, plan.schedule.recomputations()
        self.predicted_peak_bytes, self.predicted_overhead = int(plan.peak), int(plan.overhead)
        self.predicted_total_bytes = int(plan.peak) + (self.param_bytes or 0)
        self.overhead_fraction = plan.overhead / self.total_cost if self.total_cost else None

    def set_method(self, method: recompute.Measurement, vanilla: recompute.Measurement | None, cap: int | None) -> None:
        """The method's measured peak, its reduction against vanilla, and ``oom`` above ``cap`` bytes."""
        self.measured_peak_bytes, self.measured_activation_bytes = method.total_peak_bytes, method.peak_bytes
        if vanilla is not None:
            self.reduction = 1 - method.total_peak_bytes / vanilla.total_peak_bytes
        if cap is not None and method.total_peak_bytes > cap:
            self.end(Status.oom, f"measured {method.total_peak_bytes} B > device_memory_gb cap {cap} B")

    def set_timing(self, vanilla: recompute.Measurement, method: recompute.Measurement) -> None:
        """Seconds per iteration of both (median, and every timed iteration), and the method's overhead over vanilla."""
        self.vanilla_seconds_per_iter, self.seconds_per_iter = vanilla.seconds, method.seconds
        self.vanilla_iteration_seconds, self.iteration_seconds = list(vanilla.times), list(method.times)
        if vanilla.seconds and method.seconds is not None:
            self.time_overhead = method.seconds / vanilla.seconds - 1

    def end(self, status: Status, error: BaseException | str | None = None) -> None:
        """Record how the run ended; an exception is kept as its first line."""
        self.status = status
        self.error = error if error is None or isinstance(error, str) else _first_line(error)

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (enums as their values)."""
        d = asdict(self)
        d["status"] = str(self.status)
        if self.vanilla_status is not None:
            d["vanilla_status"] = str(self.vanilla_status)
        return d

    @classmethod
    def from_dict(cls, data: Any, source: str) -> RunRecord:
        """The record in ``data`` (any schema version up to :data:`SCHEMA_VERSION`); ``source`` names
        where it came from in errors. Keys this schema does not know are dropped with a warning."""
        if not isinstance(data, dict):
            raise RecordError(f"{source}: not a run record (a JSON {type(data).__name__}, expected an object)")
        version = data.get("schema_version", 1)
        if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise RecordError(f"{source}: schema_version={version!r}, this code reads 1 to {SCHEMA_VERSION} "
                              "(a record written by a newer version of the app?)")
        missing = [k for k in ("key", "net", "method", "status") if not isinstance(data.get(k), str)]
        if missing:
            raise RecordError(f"{source}: not a run record: no string {', '.join(missing)}")
        for name in ("status", "vanilla_status"):
            if data.get(name) is not None and data[name] not in _STATUS_VALUES:
                raise RecordError(f"{source}: {name}={data[name]!r}, expected one of {', '.join(_STATUS_VALUES)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            warnings.warn(f"{source}: dropped keys this schema does not know: {', '.join(unknown)}", RecordWarning,
                          stacklevel=2)
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = Status(data["status"])
        if data.get("vanilla_status") is not None:
            values["vanilla_status"] = Status(data["vanilla_status"])
        values["schema_version"] = version  # an old record says so in the DataFrame too
        return cls(**values)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RunRecord))
# numbers, also where every record left them None: a DataFrame column of them must stay numeric
NUMERIC_FIELDS: tuple[str, ...] = tuple(
    name for name, hint in get_type_hints(RunRecord).items() if hint in (int, float, int | None, float | None)
)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def write(record: RunRecord, path: str | Path) -> Path:
    """Write ``record`` to ``path`` atomically (a temp file, fsync, rename): a job killed mid-write
    never leaves half a record that a restarted sweep would take for a finished one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record.to_dict(), f, indent=1, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read(path: str | Path) -> RunRecord:
    """The record stored at ``path``; :class:`RecordError` naming the file for anything unreadable."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: unreadable ({type(e).__name__}: {e})") from e
    if not text.strip():
        raise RecordError(f"{path}: empty file (a write that never finished?)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: not valid JSON ({e}; truncated?)") from e
    rec = RunRecord.from_dict(data, str(path))
    if rec.key != path.stem:
        raise RecordError(f"{path}: holds the record of key {rec.key!r}, not {path.stem!r} (a copied or renamed file)")
    return rec


def load_artefact(path: Path, writer: str) -> dict:
    """The JSON record behind a paper artefact; FileNotFoundError naming ``writer``, the command that makes it."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {writer} writes it")
    return json.loads(path.read_text())


def write_artefact(path: Path, data: dict) -> None:
    """``data`` as ``path``'s JSON, written atomically (a killed run leaves the old record whole)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)



def artefact_main(doc: str, json_path: Path, measure: Callable[[argparse.Namespace], dict],
                  render: Callable[[dict], None], load: Callable[[Path], dict],
                  options: Callable[[argparse.ArgumentParser], None], argv: Sequence[str] | None = None) -> None:
    """The command line of an artefact's experiment: ``--write`` measures (``measure`` of the parsed
    arguments, which ``options`` adds), writes the JSON record at ``json_path`` and renders it;
    ``--render`` renders from the record only."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="measure, write the JSON record, render")
    what.add_argument("--render", action="store_true", help="render from the JSON record only")
    options(ap)
    args = ap.parse_args(argv)
    if args.write:
        write_artefact(json_path, measure(args))
    render(load(json_path))
