#!/usr/bin/env bash
# The GPU checks in one call, on a machine that is offline: a python with a CUDA build of torch
# and nvidia-ml-py, and this repository. Nothing is installed, and no Ray, Optuna or pydantic
# is needed (the Ray leg runs where they are installed: docs/clusters.md).
#
#     RAYBATCH_COMMIT=<sha> RAYBATCH_RESULTS_DIR=<dir> bash bench/gpu_offline.sh   # make gpu-check
#
# Each check runs under `timeout`, all of them within GPU_CHECK_BUDGET_S (420 s); one that
# misses a target, crashes or runs out of time does not stop the next. The results, gpu_*.json
# (with the commit and a hash of the source) and this log, go to $RAYBATCH_RESULTS_DIR
# (default bench/results/, where docs/benchmarks.md is then rendered from them).
#
# Exit status: 0 when every check ran and met its targets (known misses aside:
# bench/gpu_targets.py KNOWN_MISSES); 1 when a target was missed, or a
# check crashed or ran out of time (each is named at the end); 2 when there is no CUDA device
# here (nothing is run). PYTHON chooses the python (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET_S=${GPU_CHECK_BUDGET_S:-420}
RESULTS=${RAYBATCH_RESULTS_DIR:-bench/results}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "gpu-check: $PY has no torch; set PYTHON to the python with a CUDA build of torch" >&2
    exit 2
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing was run" >&2
    exit 2
fi
mkdir -p "$RESULTS"
exec > >(tee "$RESULTS/gpu-check.log") 2>&1

start=$SECONDS
failed=()
check() {  # check NAME CAP_S: one script, within its cap and what is left of the budget
    local left=$((BUDGET_S - (SECONDS - start)))
    local cap=$(($2 < left ? $2 : left))
    if ((cap < 10)); then
        failed+=("$1 (not run: the ${BUDGET_S} s budget is spent)")
        return
    fi
    echo "gpu-check: $1, at most $cap s"
    timeout --kill-after=10 "$cap" "$PY" "bench/$1.py"
    local status=$?
    case $status in
        0) ;;
        3) failed+=("$1 (a target missed)") ;;
        124 | 137) failed+=("$1 (out of time after $cap s)") ;;
        *) failed+=("$1 (crashed, exit status $status)") ;;
    esac
}
check gpu_trial_timing 90
check gpu_check 150
check gpu_memory_accuracy 240
check gpu_memory_history 60
check gpu_recipe_times 150

if [[ -z "${RAYBATCH_RESULTS_DIR:-}" ]]; then
    "$PY" bench/render_docs.py || failed+=("render_docs (crashed)")
fi
echo "gpu-check: $((SECONDS - start)) s"
if ((${#failed[@]})); then
    printf 'gpu-check: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "gpu-check: every target met"
