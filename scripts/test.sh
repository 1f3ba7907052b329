#!/usr/bin/env bash
# Install (reusing .venv) and run the whole test suite on the CPU (CUDA tests skip without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
export WANDB_MODE=offline WANDB_SILENT=true
.venv/bin/python -m pytest -n 2 --durations=15 "$@"
rc=$?
# pytest's 5 means "no test collected": a suite that ran nothing is a failure here
[ $rc -eq 5 ] && { echo "no tests were collected" >&2; exit 1; }
exit $rc
