"""Generated artefacts included into the hand-written docs, so no table there is typed by hand.

A doc marks each inclusion with two comments; everything between them is the file's content:

    <!-- include: paper_figures/table1.md -->
    ...rewritten by `python -m experiments.docs`...
    <!-- end include -->

or what a function of :data:`GENERATED` writes from the library itself (the planners' table, from the registry):

    <!-- generated: methods -->
    ...
    <!-- end generated -->

    python -m experiments.docs            # rewrite DOCS (the notebook stage of scripts/paper_figures.sh does)
    python -m experiments.docs --check    # exit 1 naming each doc whose included parts are stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from typing import Callable

import recompute
from recompute.planners.registry import spec

__all__ = ["DOCS", "GENERATED", "MissingInclude", "method_table", "render", "stale", "unbacked_numbers", "update"]

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "paper_figures/README.md", "docs/planners.md")
_BLOCK = re.compile(r"(<!-- include: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- end include -->)", re.S)
_GENERATED = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def method_table() -> str:
    """The planners as the registry states them: strategy, options with defaults, schedule, refusals."""
    rows = ["| planner | strategy | options (default) | own schedule | doors it refuses |", "|---|---|---|---|---|"]
    for name in recompute.methods():
        s = spec(name)
        options = ", ".join(f"`{k}={v!r}`" for k, v in s.defaults.items()) or "–"
        refused = ", ".join(f"{d.value} ({why})" for d, why in s.refuses.items()) or "none"
        rows.append(f"| `{name}` | {'tc / mc' if s.takes_strategy else '–'} | {options} | "
                    f"{'yes' if s.emits_schedule else 'no'} | {refused} |")
    return "\n".join(rows) + "\n"


GENERATED: dict[str, Callable[[], str]] = {"methods": method_table}


class MissingInclude(FileNotFoundError):
    """A doc includes a file that does not exist."""


def render(text: str, root: Path = ROOT) -> str:
    """``text`` with the body of every include block replaced by its file (paths relative to ``root``)."""
    def body(m: re.Match[str]) -> str:
        path = root / m["path"]
        if not path.is_file():
            raise MissingInclude(f"{m['path']} (included by a doc) does not exist: run STAGES=notebook bash scripts/paper_figures.sh")
        content = path.read_text()
        return m.group(1) + content + ("" if content.endswith("\n") else "\n") + m.group(4)

    def generated(m: re.Match[str]) -> str:
        if m["name"] not in GENERATED:
            raise KeyError(f"a doc asks for generated block {m['name']!r}; known: {', '.join(GENERATED)}")
        return m.group(1) + GENERATED[m["name"]]() + m.group(4)

    return _GENERATED.sub(generated, _BLOCK.sub(body, text))


def unbacked_numbers(text: str, sources: list[Path]) -> list[str]:
    """The numbers of ``text``'s prose that no value of ``sources`` (tables, CSV, JSON records) rounds to.

    Prose about a paper artefact drifts when its table is made again (a sentence said "within 3 points
    on 10 of 15" of a table that read 6 of 15). Every decimal and every integer of three or more digits in
    the prose must be a value of the records at the precision written; include blocks, code spans and
    years are not prose numbers. Each unbacked number is returned with its line.
    """
    values: set[str] = set()
    for source in sources:
        for token in re.findall(r"\d+(?:\.\d+)?", source.read_text()):
            values.update(f"{float(token):.{d}f}" for d in range(5))
    prose = re.sub(r"`[^`\n]*`", "", _BLOCK.sub("", text))
    found = []
    for line in prose.splitlines():
        for n in re.findall(r"(?<![\w.,/])(\d+(?:\.\d+)?)(?![\w,/]|\.\d)", line):
            year = "." not in n and 1990 <= int(n) <= 2030
            if ("." in n or len(n) >= 3) and not year and n not in values:
                found.append(f"{n}: {line.strip()[:120]}")
    return found


def stale(root: Path = ROOT, docs: tuple[str, ...] = DOCS) -> list[str]:
    """The docs whose include blocks differ from the files they include."""
    return [d for d in docs if render((root / d).read_text(), root) != (root / d).read_text()]


def update(root: Path = ROOT, docs: tuple[str, ...] = DOCS) -> list[str]:
    """Rewrite the include blocks of ``docs``; returns the docs that changed."""
    changed = stale(root, docs)
    for d in changed:
        path = root / d
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(render(path.read_text(), root))
        tmp.replace(path)
    return changed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale docs (exit 1 if any)")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            sys.exit(f"stale include blocks in {', '.join(bad)}: run python -m experiments.docs")
        return
    for d in update():
        print(f"rewrote the include blocks of {d}")


if __name__ == "__main__":
    main()
