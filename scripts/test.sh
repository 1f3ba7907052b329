#!/usr/bin/env bash
# Install (reusing .venv) and run the whole test suite on the CPU (CUDA tests skip without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
export WANDB_MODE=offline WANDB_SILENT=true
# One thread per xdist worker: two workers of two threads each on two cores ran torch 5x slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Blocks over 1 MiB (parameters, gradients) straight from and back to the OS: with glibc's adaptive
# threshold a worker's RSS kept what earlier tests freed (ResNet152 then VGG19: 3.9 GB, with this 3.4 GB).
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1048576}
# The paper-scale `slow` set is left out; a -m of the caller's comes later and wins (-m slow: only that set).
# worksteal: an idle worker takes queued tests from the other, so that no long test ends the run alone
.venv/bin/python -m pytest -n 2 --dist worksteal -m "not slow" --durations=15 "$@"
rc=$?
# pytest's 5 means "no test collected": a suite that ran nothing is a failure here
[ $rc -eq 5 ] && { echo "no tests were collected" >&2; exit 1; }
exit $rc
