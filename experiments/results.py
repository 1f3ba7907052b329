"""The local results store (one JSON record per experiment key) and loading records into pandas.

    df = results.load()                                   # every record under results/
    df = results.load(source="wandb", project="recompute", entity="me")   # from the W&B API
    python -m experiments.results results/ --max-batch    # a quick table on the command line
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import pandas as pd

__all__ = ["record_path", "save", "find", "load", "max_batch"]


def record_path(results_dir: str | Path, key: str) -> Path:
    return Path(results_dir) / f"{key}.json"


def save(record: dict[str, Any], results_dir: str | Path) -> Path:
    """Write ``record`` as ``<key>.json`` atomically: a killed job never leaves half a record that a
    restarted sweep would take for a finished one."""
    path = record_path(results_dir, record["key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def find(results_dir: str | Path, key: str) -> dict[str, Any] | None:
    """The stored record of ``key``, or None."""
    path = record_path(results_dir, key)
    return json.loads(path.read_text()) if path.exists() else None


def _local(results_dir: str | Path) -> list[dict[str, Any]]:
    # temp files start with a dot, so the glob skips them
    return [json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("*.json"))]


def _wandb(project: str, entity: str | None, group: str | None) -> list[dict[str, Any]]:
    import wandb

    path = f"{entity}/{project}" if entity else project
    filters = {"group": group} if group else {}
    # the record is the run's summary (see experiments.tracking); keep only its own keys
    return [{k: v for k, v in run.summary.items() if not k.startswith("_")} for run in wandb.Api().runs(path, filters=filters)]


def load(
    results_dir: str | Path = "results",
    *,
    source: Literal["local", "wandb"] = "local",
    project: str = "recompute",
    entity: str | None = None,
    group: str | None = None,
) -> pd.DataFrame:
    """All records as one DataFrame, one row per run (the nested ``config`` column stays a dict).

    ``source="wandb"`` reads run summaries of ``entity/project`` (optionally one ``group``) through
    the W&B API instead of the local store; it needs network access and a login.
    """
    records = _local(results_dir) if source == "local" else _wandb(project, entity, group)
    df = pd.DataFrame.from_records(records)
    if group is not None and source == "local" and not df.empty:
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
    df = load(args.results_dir, group=args.group)
    if df.empty:
        print(f"no records under {args.results_dir}")
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
