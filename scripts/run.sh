#!/usr/bin/env bash
# Install (reusing .venv) and run the main job: python run.py with any Hydra overrides given.
# Default: ResNet50 at the paper's batch (96) × approximate DP, time-centric; memory on the fake backend
# (or CUDA when present), W&B offline, a record in results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python run.py "$@"
