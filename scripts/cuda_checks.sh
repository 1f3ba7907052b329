#!/usr/bin/env bash
# What only a CUDA GPU can show, in one call: the CUDA tests, every plan's simulated peak against the
# real CUDA step (benchmarks.simulator --backend cuda), and the head-to-head measured on the GPU.
#
#   bash scripts/cuda_checks.sh                                # all three stages
#   STAGES="tests simulator" bash scripts/cuda_checks.sh       # some of them
#   SIM_ARGS="--nets vgg19 --budgets 1" H2H_ARGS="--nets resnet50 --solvers dp" bash scripts/cuda_checks.sh
#
# Each stage runs under its own time limit (TESTS_S, SIM_S, H2H_S seconds) and a failed stage does not
# stop the next. Logs go to $OUT (default: cuda_checks/); what the stages wrote (docs/gpu.md,
# paper_figures/cuda_pareto_*.json) to $OUT/artefacts.tar.gz. TEST_PATHS narrows the tests stage
# (default: tests). Refuses at once without a CUDA GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-cuda_checks}
STAGES=${STAGES:-tests simulator head_to_head}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "scripts/cuda_checks.sh needs a CUDA GPU (torch.cuda.is_available() is False)" >&2
    exit 1
fi
{ nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } \
    2>&1 | tee "$OUT/device.txt"

status=0
stage() {  # stage NAME SECONDS COMMAND...: run it under its limit, log to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start))s" | tee -a "$OUT/device.txt"
    [ "$rc" -eq 0 ] || status=1
}
for s in $STAGES; do
    case $s in
        tests) stage tests "${TESTS_S:-180}" "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m cuda ${TEST_PATHS:-tests} ;;
        simulator) stage simulator "${SIM_S:-240}" "$PY" -m benchmarks.simulator --backend cuda --write ${SIM_ARGS:---budgets 1} ;;
        head_to_head) stage head_to_head "${H2H_S:-300}" "$PY" -m benchmarks.head_to_head_cuda --write ${H2H_ARGS:-} ;;
        *) echo "unknown stage '$s' (allowed: tests simulator head_to_head)" >&2; exit 2 ;;
    esac
done
tar czf "$OUT/artefacts.tar.gz" docs/gpu.md paper_figures/cuda_pareto_*.json
exit $status
