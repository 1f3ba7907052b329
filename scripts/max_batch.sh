#!/usr/bin/env bash
# The largest batch that fits a device of MEM_GB GiB (default 16) per network and method: the Figure 4
# grids under a device_memory_gb cap (runs above it are status=oom), then the largest ok batch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
MEM_GB=${MEM_GB:-16}
for net in ${NETS:-resnet50 resnet152 vgg19 densenet161 googlenet unet pspnet}; do
  echo "== max batch under ${MEM_GB} GiB: $net"
  "$PY" run.py -m "experiment=figure4/$net" device_memory_gb="$MEM_GB" logger.group="max_batch_${MEM_GB}gb" \
    hydra.sweep.dir="multirun/max_batch_${MEM_GB}gb/$net" "$@"
done
"$PY" -m experiments.results results --group "max_batch_${MEM_GB}gb" --max-batch
