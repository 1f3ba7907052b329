#!/usr/bin/env bash
# Every paper artefact of paper_figures/ from one results store, end to end:
#   table1     Kusumoto et al. (2019) Table 1: 7 nets × 8 methods × DP memory model {paper, simulator}, paper
#              batch and size, memory on `fake` (on `cuda` with DEVICE=cuda);
#   max_batch  largest batch under DEVICE_GB GiB (default the paper's 11.4) per net × Figure 4 method, fake backend;
#   chen       Chen et al. (2016): activation peak against ResNet depth (Fig. 5) and against an unrolled LSTM's
#              length (Fig. 6), fake backend -> paper_figures/chen2016_{depth,lstm}.json;
#   explain    the networks that test Table 1's explanations (experiments.explain_runs, fake backend)
#              -> paper_figures/explanation_runs.json;
#   feng       Feng & Huang (2018) Table 1 (Re-forwarding, fake backend) -> paper_figures/feng2018_table1.json;
#   beaumont   Beaumont et al. (2020) Fig. 7, 8 and 9 by simulation (join DP, ~10 s) -> paper_figures/beaumont_fig{7,8,9}.csv;
#   figure4    Figure 4 timings: forward+backward steps over a batch grid, one job at a time so that timings do not
#              share the cores; on the CPU at a reduced input size, or with DEVICE=cuda on the GPU at the paper's;
#   figure4_paired  Figure 4 as a paired design: every method in the same interleaved rounds as vanilla,
#              bootstrap intervals, Holm's correction (experiments.figure4_paired, on the CPU, one net at a time)
#              -> paper_figures/figure4_paired.json;
#   notebook   notebooks/paper_figures.py executed headless: every artefact rendered from the store and the JSON
#              above (nothing measured), and the tables in README.md and paper_figures/README.md rewritten
#              between their marker comments.
# Every run is a record in $RESULTS (default paper_figures/records, committed with the artefacts); a rerun skips
# what is stored, so after a change to the planners or the memory model clear it and run this again.
#   bash scripts/paper_figures.sh                       # everything (hours on 2 cores)
#   STAGES=notebook bash scripts/paper_figures.sh       # only re-render the artefacts from the shipped records
#   DEVICE=cuda bash scripts/paper_figures.sh           # Table 1 memory and Figure 4 timings on the GPU
#   PRINT_ONLY=1 bash scripts/paper_figures.sh          # print the commands of the stages instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STAGES=${STAGES:-"table1 max_batch chen explain feng beaumont figure4 figure4_paired notebook"}
DEVICE=${DEVICE:-cpu}             # cpu: Table 1 on fake, Figure 4 timed on the CPU; cuda: both on the GPU
DEVICE_GB=${DEVICE_GB:-11.4}
JOBS=${JOBS:-2}                   # parallel runs of the table1 and max_batch sweeps (timings always run alone)
LOGGER=${LOGGER:-none}            # wandb: also log every run to W&B (offline unless configured)
RESULTS=${RESULTS:-paper_figures/records}
stage() { [[ " $STAGES " == *" $1 "* ]]; }
# the paper's seven networks, from the one list of them (recompute.nets), where a stage sweeps them
if [[ -z ${NETS:-} ]] && { stage table1 || stage max_batch || stage figure4; }; then
  NETS=$("$PY" -c 'from recompute import nets; print(*nets.names(paper_only=True))')
fi
FIG4_NETS=${FIG4_NETS:-${NETS:-}}
export PAPER_FIGURES_RESULTS="$RESULTS" PAPER_FIGURES_DEVICE_GB="$DEVICE_GB" PAPER_FIGURES_TIME_BACKEND="$DEVICE" WANDB_SILENT=true
common=(logger="$LOGGER" results_dir="$(realpath -m "$RESULTS")")

case $DEVICE in
  cpu) TABLE1_MEMORY=fake ;;
  cuda)
    TABLE1_MEMORY=cuda
    if [[ -z ${PRINT_ONLY:-} ]] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
      echo "DEVICE=cuda: no CUDA device here (torch.cuda.is_available() is False); run on a GPU machine or leave DEVICE unset" >&2
      exit 1
    fi ;;
  *) echo "DEVICE=$DEVICE: expected cpu or cuda" >&2; exit 1 ;;
esac

# Figure 4: input size and batch grid per net. Each grid straddles vanilla's largest batch under 11.4 GiB at the
# paper's size (paper_figures/max_batch.md), as the paper's Figure 4 does. On the CPU the input is reduced: 64²
# for the classifiers (32² for VGG-19, whose FLOPs are 5× ResNet-50's), 128² for the segmentation nets; on cuda it
# is the paper's (the net's default).
declare -A FIG4_SIZE=([resnet50]=64 [resnet152]=64 [vgg19]=32 [densenet161]=64 [googlenet]=64 [unet]=128 [pspnet]=128)
declare -A FIG4_GRID=(
  [resnet50]=64,128,192 [resnet152]=32,64,96 [vgg19]=64,128,192 [densenet161]=24,48,72
  [googlenet]=192,384,576 [unet]=4,8,16 [pspnet]=2,4,8
)

clock() {
  if [[ -n ${PRINT_ONLY:-} ]]; then echo "$*"; return; fi
  local t=$SECONDS; "$@"; echo "== done in $((SECONDS - t)) s: $*"
}

if stage table1; then
  echo "== Table 1 sweep (memory on $TABLE1_MEMORY)"
  net_list=$(echo $NETS | tr ' ' ',')
  clock "$PY" run.py -m experiment=table1 device="$TABLE1_MEMORY" "net=$net_list" hydra/launcher=local \
    hydra.launcher.n_jobs="$JOBS" "${common[@]}"
fi
if stage max_batch; then
  echo "== largest batch under $DEVICE_GB GiB (fake backend, paper input size)"
  clock "$PY" -m experiments.max_batch --device-memory-gb "$DEVICE_GB" --jobs "$JOBS" --results-dir "$RESULTS" --nets $NETS
fi
if stage chen; then
  echo "== Chen et al. (2016): memory vs depth -> paper_figures/chen2016_depth.json"
  clock "$PY" -m experiments.chen_depth --write
  echo "== Chen et al. (2016): memory vs LSTM length -> paper_figures/chen2016_lstm.json"
  clock "$PY" -m experiments.chen_lstm --write
fi
if stage explain; then
  echo "== the runs that test Table 1's explanations -> paper_figures/explanation_runs.json"
  clock "$PY" -m experiments.explain_runs --write
fi
if stage feng; then
  echo "== Feng & Huang (2018) Table 1 -> paper_figures/feng2018_table1.json"
  clock "$PY" -m experiments.feng_table1 --write
fi
if stage beaumont; then
  echo "== Beaumont et al. (2020) Fig. 7, 8 and 9 by simulation -> paper_figures/beaumont_fig{7,8,9}.csv"
  clock "$PY" -m experiments.beaumont_figures --write
fi
if stage figure4; then
  for net in $FIG4_NETS; do
    size=()
    [[ $DEVICE == cpu ]] && size=("input_size=${FIG4_SIZE[$net]}")
    echo "== Figure 4 on $DEVICE: $net, batches ${FIG4_GRID[$net]}"
    clock "$PY" run.py -m experiment=figure4 device="$DEVICE" "net=$net" "${size[@]}" \
      "batch_size=${FIG4_GRID[$net]}" "${common[@]}"
  done
fi
if stage figure4_paired; then
  echo "== Figure 4, paired rounds -> paper_figures/figure4_paired.json"
  clock "$PY" -m experiments.figure4_paired --write --device "$DEVICE" ${FIG4_NETS:+--nets $FIG4_NETS}
fi
if stage notebook; then
  echo "== notebooks/paper_figures.py -> paper_figures/, README.md"
  if [[ ${PAPER_FIGURES_SOURCE:-local} == local && -z ${PRINT_ONLY:-} ]]; then
    # a store the notebook would refuse (empty, or a record cut short) is refused before a kernel starts
    "$PY" -c 'import sys; from experiments import figures, record, results
try: figures.require_records(results.load(sys.argv[1], strict=True), sys.argv[1])
except (record.RecordError, figures.NoRecords) as e: sys.exit(str(e))' "$RESULTS"
  fi
  clock "$PY" -c 'from experiments.figures import execute_notebook as run; run("notebooks/paper_figures.py", "notebooks/paper_figures.ipynb")'
fi
