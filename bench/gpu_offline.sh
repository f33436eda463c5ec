#!/usr/bin/env bash
# The GPU check on a machine that is offline and has no Ray, Optuna or pydantic installed:
# python with a CUDA build of torch and nvidia-ml-py is enough, plus this repository and the
# small wheels in bench/wheels/ (pydantic and its dependencies; docs/clusters.md).
# Nothing is installed from an index: the wheels go into a temporary folder on PYTHONPATH.
#
# A wheel over the 64 MiB a transfer may carry (Ray's is about 79 MB) travels in parts:
#     bash bench/gpu_offline.sh --split path/to/ray-*.whl     # here: writes bench/wheels/*.part-*
# and this script joins them back before installing. With Ray and Optuna present too, it also
# runs `raybatch check` and a short search on the GPU; without them it says those are skipped.
#
# Usage: bash bench/gpu_offline.sh [--split WHEEL] ; PYTHON=python3.12 to choose the python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=bench/wheels

if [[ "${1:-}" == "--split" ]]; then
    mkdir -p "$WHEELS"
    split -b 60m "$2" "$WHEELS/$(basename "$2").part-"
    # The whole wheel is over what a transfer carries: only its parts stay beside the others.
    if [[ "$(cd "$(dirname "$2")" && pwd)" == "$PWD/$WHEELS" ]]; then rm -f "$2"; fi
    ls -l "$WHEELS"
    exit 0
fi

DEPS=$(mktemp -d)
trap 'rm -rf "$DEPS"' EXIT
if compgen -G "$WHEELS/*.part-*" >/dev/null; then
    for first in "$WHEELS"/*.part-aa; do
        whl=${first%.part-aa}
        cat "$whl".part-* > "$DEPS/$(basename "$whl")"
    done
fi
if compgen -G "$WHEELS/*.whl" >/dev/null; then cp "$WHEELS"/*.whl "$DEPS"/; fi
# Each wheel on its own: one that does not install here (another python) is said and skipped,
# and the checks that need only torch and NVML still run.
if compgen -G "$DEPS/*.whl" >/dev/null; then
    for whl in "$DEPS"/*.whl; do
        "$PY" -m pip install --quiet --no-index --no-deps --target "$DEPS/site" "$whl" \
            || echo "gpu-check: could not install $(basename "$whl") here; skipped"
    done
fi
export PYTHONPATH="$PWD:$DEPS/site${PYTHONPATH:+:$PYTHONPATH}"

"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: no CUDA device here (torch.cuda.is_available() is False)')"
"$PY" bench/gpu_memory_accuracy.py
"$PY" bench/gpu_trial_timing.py
"$PY" bench/gpu_check.py
if "$PY" -c "import ray, optuna" 2>/dev/null; then
    "$PY" -m raybatch check --json
    RUN=$(mktemp -d)
    "$PY" -m raybatch search raybatch.examples.digits:workload --target 0.97 --trials 6 \
        --max-time-per-trial 20 --run-dir "$RUN/run" --quiet
    rm -rf "$RUN"
else
    echo "gpu-check: skipped raybatch check and the search on the GPU: Ray and Optuna are not here"
fi
"$PY" bench/render_docs.py
