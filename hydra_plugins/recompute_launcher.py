"""The app's SLURM launcher (``conf/hydra/launcher/slurm.yaml``): submitit's, refusing a sweep where
SLURM is not installed before anything is submitted.

Without it, submitit fails in the middle of Hydra's launch with a traceback (``Could not detect
"srun"``) and no word of the launchers that run here. Hydra accepts launchers only from the
``hydra_plugins`` namespace package, hence this file; ``hydra_plugins/`` has no ``__init__.py``, so
that it adds to that namespace instead of hiding the installed plugins (joblib, submitit).
"""

from __future__ import annotations

import shutil
from typing import Any, Sequence

from hydra.errors import CompactHydraException
from hydra_plugins.hydra_submitit_launcher import submitit_launcher

__all__ = ["SlurmLauncher", "LauncherError", "SLURM_TOOLS"]

SLURM_TOOLS = ("sbatch", "srun")  # submitit submits with sbatch and refuses to start without srun


class LauncherError(CompactHydraException):
    """The sweep's launcher cannot start jobs on this machine; nothing was submitted."""


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """submitit's SLURM launcher, checking first that the SLURM tools are on PATH.

    (A Hydra callback cannot refuse a sweep: Hydra turns what a callback raises into a warning.)
    """

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
        if missing:
            raise LauncherError(
                f"hydra/launcher=slurm submits every job to SLURM, but {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not on PATH here, so nothing was submitted. Run the "
                "sweep on a SLURM login node, or on this machine: hydra/launcher=local (joblib, jobs in "
                "parallel) or no hydra/launcher (one job after another)."
            )
        return super().launch(job_overrides, initial_job_idx)
