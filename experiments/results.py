"""The local results store (one JSON record per experiment key) and loading records into pandas.

    df = results.load()                                   # every record under results/
    df = results.load(source="wandb", project="recompute", entity="me")   # from the W&B API
    python -m experiments.results results/ --max-batch    # a quick table on the command line

A file of the store that is not a readable record (truncated, empty, stray) is skipped with a
:class:`~experiments.record.RecordWarning` naming it (``load(..., strict=True)``, for the paper's
artefacts: refused), and a sweep that reaches its config moves it aside (:func:`set_aside`) and runs
that config again.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterable, Literal

import pandas as pd
from hydra.errors import CompactHydraException

from . import record
from .record import FIELDS, NUMERIC_FIELDS, RecordError, RecordWarning, RunRecord

__all__ = ["record_path", "unsaved_dir", "save", "find", "set_aside", "check_writable", "load", "max_batch", "StoreError",
           "NotStored"]


class StoreError(OSError):
    """The results store cannot be used (``results_dir`` is not writable, or a write to it failed); says
    what to do, and where a record that could not be written is kept."""


class NotStored(CompactHydraException):
    """A run's record the store could not take, as ``run.py`` reports it: the message alone (no stack
    trace), saying where the record is kept instead; a sweep names every one (``hydra_plugins.recompute_sweeper``)."""


def record_path(results_dir: str | Path, key: str) -> Path:
    return Path(results_dir) / f"{key}.json"


def unsaved_dir() -> Path:
    """Where a record goes that the store could not take: ``recompute-unsaved`` in the temp dir
    (``$TMPDIR``), usually another file system than a full or read-only store."""
    return Path(tempfile.gettempdir()) / "recompute-unsaved"


def save(rec: RunRecord, results_dir: str | Path) -> Path:
    """Write ``rec`` as ``<key>.json`` atomically.

    When that write fails (a store made read-only during the run, a full disk), the store is left as it
    was and the record is kept in :func:`unsaved_dir` instead; :class:`StoreError` then names both and the
    command that moves it into the store. Should that fail too, the error carries the record itself.
    """
    path = record_path(results_dir, rec.key)
    try:
        return record.write(rec, path)
    except OSError as e:
        failure = f"the record of run {rec.key} could not be written to {path} ({type(e).__name__}: {e.strerror or e})"
        try:
            kept = record.write(rec, unsaved_dir() / path.name)
        except OSError as again:
            raise StoreError(f"{failure}, nor kept in {unsaved_dir()} ({type(again).__name__}: {again.strerror or again}); "
                             f"the record, to save as {path} by hand: {json.dumps(rec.to_dict(), default=str)}") from e
        raise StoreError(f"{failure}; it is kept at {kept}: once the store is writable again (free space, "
                         f"permissions), move it there with `mv {kept} {path}`") from e


def find(results_dir: str | Path, key: str) -> RunRecord | None:
    """The stored record of ``key``, or None; :class:`RecordError` when its file is not a record."""
    path = record_path(results_dir, key)
    return record.read(path) if path.exists() else None


def set_aside(results_dir: str | Path, key: str) -> Path:
    """Rename the unreadable file of ``key`` out of the store (kept, not deleted) so its config can run again."""
    path = record_path(results_dir, key)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    aside = path.with_name(f"{path.name}.unreadable-{stamp}")  # no longer *.json: not in the store
    path.rename(aside)
    return aside


def check_writable(results_dir: str | Path) -> Path:
    """Create ``results_dir`` if needed and prove a record can be written there, before any run."""
    path = Path(results_dir)
    # a file where the store or a folder above it belongs: no permission fixes that
    file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
        where = "is a file" if file == path else f"is inside {file}, which is a file"
        raise StoreError(f"results_dir={results_dir} {where}, not a directory; choose a directory (one that does not "
                         "exist yet is made), e.g. results_dir=$PWD/results")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise StoreError(f"results_dir={results_dir} is not writable ({type(e).__name__}: {e.strerror or e}); "
                         "fix its permissions or choose another, e.g. results_dir=$PWD/results") from e
    return path


def _readable(loaders: Iterable[Callable[[], RunRecord]], strict: bool) -> list[RunRecord]:
    """The records that parse; every other one is skipped with a warning naming its file or run, or,
    when ``strict``, refused with one :class:`RecordError` naming them all."""
    out, unreadable = [], []
    for load_one in loaders:
        try:
            out.append(load_one())
        except RecordError as e:
            unreadable.append(str(e))
            if not strict:
                warnings.warn(f"skipped {e}. A sweep that reaches this config runs it again.", RecordWarning, stacklevel=3)
    if strict and unreadable:
        raise RecordError(
            f"{len(unreadable)} unreadable record(s), so their runs would be missing without a word:\n  "
            + "\n  ".join(unreadable) + "\nRun the sweep that wrote each again (it moves the file aside and runs "
            "its config again), or move the file out of the store if its run is not wanted.")
    return out


def _local(results_dir: str | Path, strict: bool) -> list[RunRecord]:
    # temp files of unfinished writes start with a dot and end in .tmp: the glob skips them
    return _readable((functools.partial(record.read, p) for p in sorted(Path(results_dir).glob("*.json"))), strict)


def _wandb(project: str, entity: str | None, group: str | None, strict: bool) -> list[RunRecord]:
    import wandb

    path = f"{entity}/{project}" if entity else project
    filters = {"group": group} if group else {}
    # the record is the run's summary (see experiments.runner.run); W&B's own keys start with "_"
    return _readable((
        functools.partial(RunRecord.from_dict, {k: v for k, v in r.summary.items() if not k.startswith("_")},
                          f"W&B run {'/'.join(r.path)}")
        for r in wandb.Api().runs(path, filters=filters)
    ), strict)


def load(
    results_dir: str | Path = "results",
    *,
    source: Literal["local", "wandb"] = "local",
    project: str = "recompute",
    entity: str | None = None,
    group: str | None = None,
    strict: bool = False,
) -> pd.DataFrame:
    """All records as one DataFrame, one row per run and one column per :class:`RunRecord` field
    (the nested ``config`` column stays a dict); an empty store gives no rows but every column.

    ``source="wandb"`` reads run summaries of ``entity/project`` (optionally one ``group``) through
    the W&B API instead of the local store; it needs network access and a login. An unreadable record
    is skipped with a warning, or with ``strict`` (for artefacts, which must not lose a run quietly)
    refused: :class:`RecordError` naming every such file or run.
    """
    records = _local(results_dir, strict) if source == "local" else _wandb(project, entity, group, strict)
    df = pd.DataFrame([r.to_dict() for r in records], columns=list(FIELDS))
    df = df.astype({name: float for name in NUMERIC_FIELDS if df[name].isna().all()})
    if group is not None and source == "local":
        df = df[df["group"] == group]
    return df


def max_batch(df: pd.DataFrame) -> pd.DataFrame:
    """Largest batch size with ``status == "ok"`` per (net, method): the max-batch experiment."""
    ok = df[df["status"] == "ok"]
    return ok.groupby(["net", "method"])["batch_size"].max().unstack("method")


def _main() -> None:
    parser = argparse.ArgumentParser(description="Summarise the local results store.")
    parser.add_argument("results_dir", nargs="?", default="results")
    parser.add_argument("--group", default=None, help="only records of this W&B group (e.g. table1)")
    parser.add_argument("--max-batch", action="store_true", help="largest ok batch per net and method")
    args = parser.parse_args()
    if not Path(args.results_dir).is_dir():
        sys.exit(f"no results store at {args.results_dir}: run an experiment first (python run.py ...)")
    df = load(args.results_dir, group=args.group)
    if df.empty:
        print(f"no records under {args.results_dir}" + (f" in group {args.group}" if args.group else ""))
        return
    if args.max_batch:
        print(max_batch(df).to_string())
        return
    gib = lambda s: (s / 2**30).round(2)  # noqa: E731
    table = df.assign(measured_gib=gib(df["measured_peak_bytes"]), vanilla_gib=gib(df["vanilla_peak_bytes"]))
    cols = ["net", "method", "batch_size", "status", "measured_gib", "vanilla_gib", "reduction", "overhead_fraction"]
    print(table.sort_values(["net", "method", "batch_size"])[cols].to_string(index=False))


if __name__ == "__main__":
    _main()
