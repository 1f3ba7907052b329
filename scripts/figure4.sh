#!/usr/bin/env bash
# Figure 4: for each network a batch-size grid × {vanilla, chen, approxdp_tc, approxdp_mc}
# (conf/experiment/figure4/<net>.yaml). NETS="resnet50 unet" limits the networks; extra arguments go to Hydra.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
for net in ${NETS:-resnet50 resnet152 vgg19 densenet161 googlenet unet pspnet}; do
  echo "== figure 4: $net"
  "$PY" run.py -m "experiment=figure4/$net" "$@"
done
"$PY" -m experiments.results results --group figure4
