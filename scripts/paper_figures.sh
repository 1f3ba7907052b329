#!/usr/bin/env bash
# Kusumoto et al. (2019) Table 1, Figure 4 and the largest batch, end to end:
#   1. Table 1 sweep: 7 nets × 6 methods at the paper's batch and size, memory on `fake` (TABLE1_DEVICE=cuda
#      on a GPU machine);
#   2. largest batch under DEVICE_GB GiB (default the paper's 11.4) per net × Figure 4 method, fake backend;
#   3. Figure 4 timings: real forward+backward runs on the CPU at a reduced input size over a batch grid
#      (one job at a time, so that timings do not share the cores);
#   4. notebooks/paper_figures.py executed headless -> paper_figures/{table1,max_batch}.{md,csv},
#      figure4.{png,pdf}, and notebooks/paper_figures.ipynb (generated, not committed);
#   5. Beaumont et al. (2020) Fig. 7 and Fig. 9 by simulation (join DP, ~10 s) -> paper_figures/beaumont_fig{7,9}.{png,csv}.
#   6. Feng & Huang (2018) Table 1 (Re-forwarding, fake backend) -> paper_figures/feng2018_table1.{md,csv}.
# Every run is a record in results/; a rerun skips what is stored, so after a change to the memory model
# clear results/ (or point RESULTS elsewhere) and run this again.
#   bash scripts/paper_figures.sh                       # everything
#   FIG4_NETS="resnet50 pspnet" bash scripts/paper_figures.sh
#   STAGES="notebook" bash scripts/paper_figures.sh     # only re-render the artefacts from the store
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STAGES=${STAGES:-"table1 max_batch figure4 notebook beaumont feng"}
DEVICE_GB=${DEVICE_GB:-11.4}
LOGGER=${LOGGER:-none}            # wandb: also log every run to W&B (offline unless configured)
RESULTS=${RESULTS:-results}
# the paper's seven networks, from the one list of them (recompute.nets)
NETS=${NETS:-$("$PY" -c 'from recompute import nets; print(*nets.names(paper_only=True))')}
FIG4_NETS=${FIG4_NETS:-$NETS}
export PAPER_FIGURES_RESULTS="$RESULTS" PAPER_FIGURES_DEVICE_GB="$DEVICE_GB" WANDB_SILENT=true
common=(logger="$LOGGER" results_dir="$(realpath -m "$RESULTS")")

# Figure 4 on the CPU: input size and batch grid per net. Each grid straddles vanilla's largest batch under
# 11.4 GiB at the paper's size (paper_figures/max_batch.md), as the paper's Figure 4 does. Input sizes: 64²
# for the classifiers (32² for VGG-19, whose FLOPs are 5× ResNet-50's), 128² for the segmentation nets;
# 3 points per grid keep this stage around half an hour on 2 cores.
declare -A FIG4_SIZE=([resnet50]=64 [resnet152]=64 [vgg19]=32 [densenet161]=64 [googlenet]=64 [unet]=128 [pspnet]=128)
declare -A FIG4_GRID=(
  [resnet50]=64,128,192 [resnet152]=32,64,96 [vgg19]=64,128,192 [densenet161]=24,48,72
  [googlenet]=192,384,576 [unet]=4,8,16 [pspnet]=2,4,8
)

stage() { [[ " $STAGES " == *" $1 "* ]]; }
clock() { local t=$SECONDS; "$@"; echo "== done in $((SECONDS - t)) s: $*"; }

if stage table1; then
  echo "== Table 1 sweep"
  net_list=$(echo $NETS | tr ' ' ',')
  clock "$PY" run.py -m experiment=table1 device="${TABLE1_DEVICE:-fake}" "net=$net_list" hydra/launcher=local "${common[@]}"
fi
if stage max_batch; then
  echo "== largest batch under $DEVICE_GB GiB (fake backend, paper input size)"
  clock "$PY" -m experiments.max_batch --device-memory-gb "$DEVICE_GB" --jobs 2 --results-dir "$RESULTS" --nets $NETS
fi
if stage figure4; then
  for net in $FIG4_NETS; do
    echo "== Figure 4 on the CPU: $net at ${FIG4_SIZE[$net]}², batches ${FIG4_GRID[$net]}"
    clock "$PY" run.py -m experiment=figure4_cpu "net=$net" "input_size=${FIG4_SIZE[$net]}" \
      "batch_size=${FIG4_GRID[$net]}" "${common[@]}"
  done
fi
if stage notebook; then
  echo "== notebooks/paper_figures.py -> paper_figures/"
  clock "$PY" -c 'from experiments.figures import execute_notebook as run; run("notebooks/paper_figures.py", "notebooks/paper_figures.ipynb")'
fi
if stage beaumont; then
  echo "== Beaumont et al. (2020) Fig. 7 and Fig. 9 by simulation -> paper_figures/"
  clock "$PY" -m experiments.beaumont_figures --write
fi
if stage feng; then
  echo "== Feng & Huang (2018) Table 1 -> paper_figures/feng2018_table1.{md,csv}"
  clock "$PY" -m experiments.feng_table1 --write
fi
