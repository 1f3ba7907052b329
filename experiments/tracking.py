"""Weights & Biases logging: one W&B run per experiment, finished whatever happens."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .config import LoggerConfig, WandbMode

__all__ = ["wandb_run"]


@contextlib.contextmanager
def wandb_run(cfg: LoggerConfig, *, name: str, group: str | None, config: dict[str, Any]) -> Iterator[Any]:
    """A W&B run (``None`` when ``mode=disabled``); ``log(record)`` on it puts the record in its summary.

    ``wandb.finish()`` runs even when the experiment raises, so each job of a multirun that shares
    one process (the basic launcher) is a run of its own.
    """
    if cfg.mode == WandbMode.disabled:
        yield None
        return
    import wandb

    run = wandb.init(
        mode=cfg.mode.value,
        project=cfg.project,
        entity=cfg.entity,
        group=cfg.group or group,
        name=name,
        tags=list(cfg.tags),
        dir=cfg.dir,
        config=config,
        reinit="finish_previous",
    )
    exit_code = 1
    try:
        yield run
        exit_code = 0
    finally:
        wandb.finish(exit_code=exit_code)
