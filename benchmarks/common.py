"""Shared helpers of the benchmark scripts: paper reference numbers and markdown tables."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any, Callable, Sequence

from experiments.figures import paper_table1_wide

REPO = Path(__file__).resolve().parents[1]


def paper_table1() -> dict[str, dict[str, float]]:
    """Kusumoto et al. Table 1 by network: GB per method, batch and #V (``experiments/reference``)."""
    return paper_table1_wide().astype(float).to_dict("index")


def head_commit() -> str:
    """The short hash of the checkout's HEAD, to name the commit an artefact was made at: read it before
    the run, since a commit made while a benchmark runs is not the code that ran. In a copy of the
    tree without git (a lent GPU machine's), ``RECOMPUTE_COMMIT`` names it."""
    if "RECOMPUTE_COMMIT" in os.environ:
        return os.environ["RECOMPUTE_COMMIT"]
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()


def command_line(argv: Sequence[str] | None = None, env: Sequence[str] = ("OMP_NUM_THREADS",)) -> str:
    """The command running, as a user would type it: ``python -m <module> <arguments>`` (``argv``: the
    arguments, where ``main`` was handed them; else the process's), after the variables of ``env`` that
    are set (by default the thread count, which shapes a benchmark's timings)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {Path(sys.argv[0]).name}"
    settings = "".join(f"{k}={os.environ[k]} " for k in env if k in os.environ)
    arguments = shlex.join(sys.argv[1:] if argv is None else argv)
    return f"{settings}{program}{' ' + arguments if arguments else ''}"


def made_by(commit: str, *details: str, argv: Sequence[str] | None = None) -> str:
    """The line above a table that says what made it: the command (:func:`command_line`), the commit it
    ran at (:func:`head_commit`, read before the run) and the date, then ``details``."""
    return f"`{command_line(argv)}` (" + ", ".join([f"commit {commit}", str(date.today()), *details]) + ")"


def shared_cache_bytes(default: int = 32 * 2**20) -> int:
    """The size of this CPU's last-level cache (the largest cache sysfs lists for cpu0), ``default``
    where sysfs does not say."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=default)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(path: Path, marker: str, text: str) -> None:
    """Replace the text between ``<!-- marker -->`` and ``<!-- /marker -->`` in ``path`` (or append)."""
    begin, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old + ("\n" if old else "") + block + "\n"
    # atomically: a run stopped while writing leaves the old file, never half of one
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new)
    tmp.replace(path)


# which page of docs/ holds each generated section (tests/test_paper_figures.py checks both ways)
DOC_PAGES: dict[str, str] = {
    "corpus-table": "models.md",
    "cpu-time-table": "simulator.md",
    "cuda-head-to-head": "gpu.md",
    "cuda-workspace": "gpu.md",
    "graphs-table": "graphs.md",
    "head-to-head": "paper_scale.md",
    "llm": "models.md",
    "measured": "pytorch.md",
    "memory-table": "planners.md",
    "milp-table": "planners.md",
    "multirecompute-table": "planners.md",
    "refine": "planners.md",
    "reforward-table": "planners.md",
    "simulator-cuda-table": "gpu.md",
    "simulator-table": "simulator.md",
    "solve-time-app": "planners.md",
    "solve-time-liveness": "planners.md",
    "solve-time-paper": "planners.md",
    "time-model": "simulator.md",
}


def write_doc(marker: str, text: str) -> None:
    """Write the generated section ``marker`` into its page of ``docs/`` (:data:`DOC_PAGES`)."""
    write_section(REPO / "docs" / DOC_PAGES[marker], marker, text)



def write_atomic(path: Path, write: Callable[[str], Any]) -> None:
    """``write(tmp)`` into a temporary file in ``path``'s folder, then rename it to ``path``: a stopped
    run leaves the old file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def in_range(kind: type[int] | type[float], low: float, high: float = math.inf, *,
             above: bool = False) -> Callable[[str], Any]:
    """An argparse ``type=`` reading a ``kind`` from ``low`` (above it, with ``above``) to ``high``. Another
    value, NaN or no number at all is a usage error naming the argument, the value and what it takes
    (argparse exits 2 before any work): a count of 0 or -3 would otherwise start a run, or fail deep in it."""
    what = "an integer" if kind is int else "a number"
    what += f" above {low:g}" if above else f" from {low:g}"
    what += f" to {high:g}" if high < math.inf else ("" if above else " up")

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not ((low < value if above else low <= value) and value <= high):  # NaN fails both
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


# the kinds of value the benchmarks' command lines take
POSITIVE_INT = in_range(int, 1)  # counts: budgets, steps, repeats, jobs, sizes
NON_NEGATIVE_INT = in_range(int, 0)  # warm-up steps, retries
POSITIVE = in_range(float, 0, above=True)  # seconds, GiB
NON_NEGATIVE = in_range(float, 0)  # limits where 0 means none
FRACTION = in_range(float, 0, 1)  # torch.compile's activation_memory_budget


def net_method_args(doc: str, methods: Sequence[str], default_nets: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of a per-network × method benchmark: ``--nets`` (default ``default_nets``, else
    the paper's seven), ``--methods``, ``--write``."""
    from experiments import nets

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--nets", nargs="+", default=list(default_nets or nets.names(paper_only=True)))
    parser.add_argument("--methods", nargs="+", default=list(methods), choices=list(methods))
    parser.add_argument("--write", action="store_true", help="update its section of docs/ (benchmarks.common.DOC_PAGES)")
    return parser.parse_args()
