"""Entry point: ``python run.py net=pspnet method=approxdp_mc`` (one run) or ``python run.py -m ...``.

The configs are under ``conf/``; the work is done by ``experiments.runner``. Exit status: 0 when every
job ended with an outcome (ok, oom, infeasible, ...); 1 for a config mistake (reported before any
work), a run that failed with ``status=error`` (its record is stored all the same) or a record the
results store could not take (kept elsewhere, and the message says where).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments import config, results, runner, tracking
from experiments.record import Status


class RunFailed(CompactHydraException):
    """A run ended with ``status=error``: a failure of the code, stored, and reported by the exit status."""


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    exp = config.to_experiment(cfg, hc.overrides.task)
    multirun = hc.mode == RunMode.MULTIRUN
    job = f"{exp.net.name.value}-{exp.method.name}-b{exp.batch_size}"
    try:
        record, ran = runner.run(
            exp,
            name=f"{hc.job.num}-{job}" if multirun else job,
            group=tracking.sweep_group(hc) if multirun else None,  # one group per sweep command, across restarts
            wandb_config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        )
    except results.StoreError as e:
        raise results.NotStored(str(e)) from e
    print(runner.summary(record) if ran else f"skipped {job}: record {record.key} exists (status={record.status})")
    if record.status == Status.error:
        raise RunFailed(f"{job} failed with status=error (record {record.key} stored): {record.error}")


if __name__ == "__main__":
    try:
        config.check_command_line(sys.argv[1:])  # before Hydra, whose parser would refuse them with its lexer's words
    except config.ConfigError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
    main()
