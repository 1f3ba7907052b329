"""Every artefact of ``paper_figures/`` rendered from stored records, nothing measured.

``notebooks/paper_figures.py`` (the notebook stage of ``scripts/paper_figures.sh``) calls these and
shows what they wrote; the tests call them to check that the committed artefacts are what the
committed records render.

* :func:`tables` — from the results store: ``table1.{md,csv}``, ``differences.md`` (one explanation
  per flagged cell, :mod:`experiments.explain`), ``claims.md`` (:mod:`experiments.claims`),
  ``max_batch.{md,csv}``, ``figure4.md``;
* :func:`figure4_plot` — ``figure4.{png,pdf}`` from the same store;
* :func:`from_json` — Chen et al.'s depth sweep, Feng & Huang's Table 1 and Beaumont et al.'s
  figures, each from the JSON/CSV its own stage wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import beaumont_figures, chen_depth, chen_lstm, claims, explain, explain_runs, feng_table1, figure4_paired, figures

__all__ = ["Rendered", "tables", "figure4_plot", "from_json", "TABLE_FILES"]

# what :func:`tables` writes: text, so a re-render can be compared byte for byte quickly
TABLE_FILES = ("table1.md", "table1.csv", "differences.md", "claims.md", "max_batch.md", "max_batch.csv", "figure4.md")


@dataclass
class Rendered:
    """The frames behind the tables, for display."""

    table1: pd.DataFrame
    explanations: list[explain.Explanation]
    max_batch: pd.DataFrame
    timings: pd.DataFrame


def tables(df: pd.DataFrame, out: Path, device_memory_gb: float, time_backend: str) -> Rendered:
    """Write :data:`TABLE_FILES` into ``out`` from the records ``df``."""
    out.mkdir(parents=True, exist_ok=True)
    t1 = figures.write_table1(df, out)
    explained = explain.explanations(t1, explain_runs.frame())
    (out / "differences.md").write_text(
        f"Cells of `table1.md` more than {figures.FLAG_POINTS:g} points from the paper's printed reduction, one "
        "explanation each, computed by `experiments/explain.py` from that table and the runs that test the "
        "causes (`explanation_runs.md`, by `python -m experiments.explain_runs --write`), rendered by "
        "`STAGES=notebook bash scripts/paper_figures.sh`.\n\n" + explain.markdown(explained) + "\n")
    mb = figures.write_max_batch(df, out, device_memory_gb)
    (out / "claims.md").write_text(
        "The paper's claims about Table 1 and the largest batch (Kusumoto et al. 2019, §5), checked on `table1.md` "
        "and `max_batch.md` by `experiments/claims.py` (rendered by `STAGES=notebook bash scripts/paper_figures.sh`)."
        "\n\n" + claims.markdown(claims.claims(t1, mb)) + "\n")
    timings = figures.figure4_records(df, time_backend)
    (out / "figure4.md").write_text(figures.figure4_markdown(timings, time_backend) + "\n")
    return Rendered(t1, explained, mb, timings)


def figure4_plot(r: Rendered, out: Path, device_memory_gb: float, time_backend: str) -> None:
    """``figure4.{png,pdf}`` (no creation date, so a re-render is byte-identical)."""
    fig = figures.figure4(r.timings, r.max_batch, device_memory_gb, time_backend)
    fig.savefig(out / "figure4.png", dpi=150, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(out / "figure4.pdf", bbox_inches="tight", metadata={"Creator": None, "Producer": None, "CreationDate": None})


def from_json(src: Path, out: Path) -> list[str]:
    """The artefacts whose stage wrote a JSON/CSV record into ``src``, rendered into ``out``; returns the
    records not found (their stage has not been run: their artefacts are left as they are)."""
    out.mkdir(parents=True, exist_ok=True)
    missing = []
    for name, mod in (("chen2016_depth", chen_depth), ("chen2016_lstm", chen_lstm), ("feng2018_table1", feng_table1),
                      ("explanation_runs", explain_runs), ("figure4_paired", figure4_paired)):
        if (src / f"{name}.json").exists():
            mod.render(mod.load(src / f"{name}.json"), out / name)
        else:
            missing.append(f"{name}.json")
    csvs = ("beaumont_fig7.csv", "beaumont_fig8.csv", "beaumont_fig9.csv", "beaumont_figures.json")  # the data and what made it
    if all((src / c).exists() for c in csvs):
        for c in csvs if src.resolve() != out.resolve() else ():
            (out / c).write_bytes((src / c).read_bytes())
        beaumont_figures.render(out)
    else:
        missing += [c for c in csvs if not (src / c).exists()]
    return missing
