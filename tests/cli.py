"""``python run.py ...`` inside the test process: its exit status, stdout and stderr.

A new interpreter pays ~6 s of imports (torch, Hydra, the library) and TorchDynamo's and numba's loads
before the run's first line of work; what one run prints and returns does not depend on them, so the
tests of a single run call :func:`run_py`, which runs ``run.py`` as ``__main__`` with the arguments,
environment and working directory of the command, and puts back the process-wide state Hydra changes
(the logging configuration, its global instance). Sweeps, whose launchers start processes of their
own, and W&B, whose service outlives a run, are still tested in new processes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from unittest import mock

from hydra.core.global_hydra import GlobalHydra

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Exit:
    """What the shell would see of ``python run.py ...``."""

    returncode: int
    stdout: str
    stderr: str


def run_py(*args: str, env: dict[str, str] | None = None) -> Exit:
    """Run ``python run.py *args`` from the repository's root, with ``env`` added to the environment."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (_hydra_state_restored(), mock.patch.dict(os.environ, env or {}), mock.patch.object(sys, "argv", ["run.py", *args]),
          contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        try:
            runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
        except SystemExit as e:  # Hydra exits 1 after printing a failure; a plain return is 0
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return Exit(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _hydra_state_restored() -> Iterator[None]:
    """Hydra configures logging (handlers on the root logger, one writing a file in the run's folder) and
    keeps its instance in a global: both are put back as they were, the handlers it added closed."""
    saved = {lg: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in _loggers()}
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        for lg in _loggers():
            level, handlers, propagate, disabled = saved.get(lg, (logging.NOTSET, [], True, False))
            for h in lg.handlers:
                if h not in handlers:
                    h.close()
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
