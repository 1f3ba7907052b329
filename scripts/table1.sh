#!/usr/bin/env bash
# Kusumoto et al. (2019) Table 1: 7 networks × {vanilla, chen, approxdp_mc/tc, exactdp_mc/tc}, peak memory
# on the fake backend at paper scale. Extra arguments go to Hydra, e.g. hydra/launcher=local or
# hydra/launcher=slurm hydra.launcher.partition=gpu device=cuda. Restarting skips finished configs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" run.py -m experiment=table1 "$@"
"$PY" -m experiments.results results --group table1
