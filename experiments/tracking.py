"""Weights & Biases logging: one W&B run per experiment, finished whatever happens, in one group per sweep.

W&B is a mirror of the local results store, never a condition for it: ``mode=online`` without a
reachable server logs offline instead (after a check of a few seconds, not ``wandb.init``'s
90 s wait), and a W&B run that cannot start at all leaves the experiment unlogged but still run and
stored. Each fallback is announced with a warning that says what happened and what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator
from urllib.error import HTTPError
from urllib.request import urlopen

from omegaconf import DictConfig, OmegaConf

from .config import LoggerConfig, WandbMode

__all__ = ["wandb_run", "reachable", "sweep_group", "CONNECT_SECONDS"]

log = logging.getLogger(__name__)

CONNECT_SECONDS = 5.0  # how long the online check waits for the W&B server to answer


def reachable(url: str, timeout: float = CONNECT_SECONDS) -> bool:
    """Whether the server at ``url`` answers an HTTP(S) request within ``timeout`` seconds (any status).

    An HTTP answer, not just an open TCP connection: a proxy may accept connections for hosts it
    cannot reach. The request runs in a daemon thread because the name lookup ignores ``timeout``.
    """
    answer: list[bool] = []

    def ask() -> None:
        try:
            urlopen(url, timeout=timeout).close()
        except HTTPError:  # an answer, if not a welcome one: the server is there
            pass
        except Exception:  # noqa: BLE001 - no name, no route, refused, TLS or protocol failure: not reachable
            answer.append(False)
            return
        answer.append(True)

    asking = threading.Thread(target=ask, name="wandb-reachable", daemon=True)
    asking.start()
    asking.join(timeout)
    return answer == [True]


def _init(cfg: LoggerConfig, **kwargs: Any) -> Any:
    """``wandb.init`` in ``cfg.mode``, falling back to offline, then to no W&B run (None)."""
    import wandb

    modes = [cfg.mode.value]
    if cfg.mode == WandbMode.online:
        settings = wandb.Settings()
        settings.update_from_env_vars(dict(os.environ))  # WANDB_BASE_URL, as wandb.init will read it
        url = settings.base_url
        if not reachable(url):
            log.warning("W&B server %s not reachable within %g s: this run is logged offline under %s "
                        "(upload it later with `wandb sync`)", url, CONNECT_SECONDS, cfg.dir)
            modes = []
        modes.append(WandbMode.offline.value)
    for mode in modes:
        try:
            return wandb.init(mode=mode, settings=wandb.Settings(init_timeout=30), **kwargs)
        except Exception as e:  # noqa: BLE001 - whatever W&B raises, the experiment itself must go on
            log.warning("W&B (mode=%s) did not start: %s: %s", mode, type(e).__name__, e)
    log.warning("this run is not logged to W&B; its record is stored locally all the same")
    return None


@contextlib.contextmanager
def wandb_run(cfg: LoggerConfig, *, name: str, group: str | None, config: dict[str, Any]) -> Iterator[Any]:
    """A W&B run, or ``None`` when ``mode=disabled`` or W&B could not start; put the record in its summary.

    ``wandb.finish()`` runs even when the experiment raises, so each job of a multirun that shares
    one process (the basic launcher) is a run of its own.
    """
    run = None
    if cfg.mode != WandbMode.disabled:
        run = _init(cfg, project=cfg.project, entity=cfg.entity, group=cfg.group or group, name=name,
                    tags=list(cfg.tags), dir=cfg.dir, config=config, reinit="finish_previous")
    if run is None:
        yield None
        return
    exit_code = 1
    try:
        yield run
        exit_code = 0
    finally:
        run.finish(exit_code=exit_code)


def sweep_group(hc: DictConfig) -> str:
    """The group of a multirun's records and W&B runs (``hc``: the job's ``HydraConfig.get()``):
    ``sweep-`` and a hash of the sweep's own command-line overrides (Hydra's, such as the launcher and
    the sweep dir, are not part of it).

    A sweep restarted with the same command, after ``kill -9`` or a crash, is the same group, though its
    timestamped sweep dir is new: the records it skips and the ones it adds stay together. The
    overrides are read from the ``multirun.yaml`` Hydra writes to the sweep dir before the first job.
    """
    saved = Path(hc.runtime.cwd, hc.sweep.dir, "multirun.yaml")
    try:
        overrides = OmegaConf.load(saved).hydra.overrides.task
    except (OSError, AttributeError) as e:  # a sweeper that writes no multirun.yaml: one group per sweep dir
        log.warning("cannot read the sweep's overrides from %s (%s): its group is the sweep dir %s",
                    saved, e, hc.sweep.dir)
        return str(hc.sweep.dir)
    text = "\n".join(sorted(str(o) for o in overrides))
    return f"sweep-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
