"""The app's sweeper (``hydra/sweeper: recompute`` in ``conf/config.yaml``): Hydra's basic sweeper, with
what a sweep needs on every launcher.

* A SLURM launcher (``hydra/launcher=slurm``, the app's preset, or submitit's own ``submitit_slurm``)
  where SLURM is not installed is refused before anything is submitted: submitit would fail in the
  middle of Hydra's launch with a traceback (``Could not detect "srun"``) and no word of the launchers
  that run here.
* The jobs of submitit's local launcher (``hydra/launcher=submitit_local``) end with the sweep, as the
  joblib launcher's do (:func:`experiments.runner.exit_with_sweep`): they are no children of the
  sweep but of submitit's controller, so the sweep tells them its process id.
* A batch in which the store could not take several records raises one error naming every one
  (Hydra's sweeper raises the first failure of a batch only, and the others' records would be kept
  aside without a word).

The checks live in the sweeper, not in launchers of the app's own: submitit's config names
(``submitit_slurm``, ``submitit_local``) cannot be pointed at other classes from here, since Hydra's
plugin scan runs submitit's registration again after this module's; and a Hydra callback cannot
refuse a sweep (Hydra turns what a callback raises into a warning). Hydra accepts sweepers only from the ``hydra_plugins`` namespace
package, hence this file; ``hydra_plugins/`` has no ``__init__.py``, so that it adds to that namespace
instead of hiding the installed plugins (joblib, submitit).
"""

from __future__ import annotations

import os
import shutil
from typing import Sequence

from hydra._internal.core_plugins import basic_sweeper
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from omegaconf import DictConfig

from experiments.results import NotStored
from experiments.runner import SWEEP_PID

__all__ = ["Sweeper", "LauncherError", "SLURM_TOOLS"]

SLURM_TOOLS = ("sbatch", "srun")  # submitit submits with sbatch and refuses to start without srun


class LauncherError(CompactHydraException):
    """The sweep's launcher cannot start jobs on this machine; nothing was submitted."""


class Sweeper(basic_sweeper.BasicSweeper):
    """Hydra's basic sweeper: the same overrides, batches and presets (``hydra.sweeper.params``)."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        launcher = self.launcher
        if isinstance(launcher, submitit_launcher.SlurmLauncher):
            _check_slurm(config.hydra.runtime.choices["hydra/launcher"])
        elif isinstance(launcher, submitit_launcher.LocalLauncher):
            os.environ[SWEEP_PID] = str(os.getpid())  # submitit starts each job with this process's environment
        self.launcher = _EveryUnstoredNamed(launcher)


def _check_slurm(choice: str) -> None:
    """:class:`LauncherError` unless SLURM's tools are on PATH."""
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if missing:
        raise LauncherError(
            f"hydra/launcher={choice} submits every job to SLURM, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not on PATH here, so nothing was submitted. Run the "
            "sweep on a SLURM login node, or on this machine: hydra/launcher=local (joblib, jobs in "
            "parallel) or no hydra/launcher (one job after another)."
        )


class _EveryUnstoredNamed:
    """The sweep's launcher, raising one :class:`~experiments.results.NotStored` that names every record
    of a batch the store could not take, where there are several."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        returns = self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        unstored = [r for r in returns if r.status == JobStatus.FAILED and isinstance(r._return_value, NotStored)]
        if len(unstored) > 1:
            raise NotStored(f"{len(unstored)} records could not be stored:\n"
                            + "\n".join(f"  {' '.join(r.overrides)}: {r._return_value}" for r in unstored))
        return returns


ConfigStore.instance().store(group="hydra/sweeper", name="recompute", provider="recompute",
                             node=basic_sweeper.BasicSweeperConf(_target_="hydra_plugins.recompute_sweeper.Sweeper"))
