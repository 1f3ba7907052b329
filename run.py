"""Entry point: ``python run.py net=pspnet method=approxdp_mc`` (one run) or ``python run.py -m ...``.

The configs are under ``conf/``; the work is done by ``experiments.runner``.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments import config, runner


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    exp = config.to_experiment(cfg)
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    job = f"{exp.net.name.value}-{exp.method.name}-b{exp.batch_size}"
    record, ran = runner.run(
        exp,
        name=f"{hc.job.num}-{job}" if multirun else job,
        group=hc.sweep.dir if multirun else None,  # every job of one sweep shares a W&B group
        wandb_config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
    )
    print(runner.summary(record) if ran else f"skipped {job}: record {record['key']} exists (status={record['status']})")


if __name__ == "__main__":
    main()
