# The two commands of the README: `make demo` and `make test`. Both set themselves up.
#
# torch is installed first and pinned to 2.13.0: on our machines that is a CPU wheel already
# on disk, while a bare `torch` (or a range admitting a newer release) pulls several GB of CUDA
# packages. The package's own floor (torch>=2.5) is then satisfied and pip leaves torch alone.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.raybatch-installed
RUNTIME_STAMP := $(VENV)/.raybatch-runtime

.PHONY: setup demo test lint bench gpu-check clean

setup: $(STAMP)

# What the demo needs: the package's runtime dependencies and scikit-learn (the examples' data),
# nothing of the dev extras (transformers, lightning, deepspeed, the linters).
$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[examples]'
	touch $(RUNTIME_STAMP)

# What the tests, the linters and the benchmarks need besides: the dev extras.
$(STAMP): $(RUNTIME_STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,examples]'
	touch $(STAMP)

demo: $(RUNTIME_STAMP)
	$(BIN)/raybatch search raybatch.examples.tabular:workload --target "accuracy>=0.87" \
		--trials 12 --max-time-per-trial 20 --run-dir runs/demo-$$(date +%Y%m%d-%H%M%S)

lint: $(STAMP)
	$(BIN)/ruff check raybatch tests examples bench
	$(BIN)/ruff format --check raybatch tests examples bench
	$(BIN)/mypy

# Two processes, a test file each at a time (--dist loadfile): most of the suite waits on Ray and
# on subprocesses, so two cores finish it in a little over half the time of one. Every test
# process starts a Ray of its own (address="local"), so the two never share one. The 20 slowest
# tests are listed at the end: where the suite's minutes go, on every run.
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=20

bench: $(STAMP)
	$(BIN)/python bench/search_efficiency.py
	$(BIN)/python bench/real_training.py
	$(BIN)/python bench/rung_replay.py
	$(BIN)/python bench/near_ties.py
	$(BIN)/python bench/prescreen_cost.py
	$(BIN)/python bench/space_overhead.py
	$(BIN)/python bench/plugin_overhead.py
	$(BIN)/python bench/loop_overhead.py
	$(BIN)/python bench/demo_search.py
	$(BIN)/python bench/trace_cost.py
	$(BIN)/python bench/digits_batch_sweep.py
	$(BIN)/python bench/gpu_memory_accuracy.py
	$(BIN)/python bench/gpu_trial_timing.py
	$(BIN)/python bench/gpu_check.py
	$(BIN)/python bench/render_docs.py

# Every GPU verification, in one call on a machine with an NVIDIA GPU, offline included: its own
# python with a CUDA torch and nvidia-ml-py is enough (no set-up, no index, no Ray, Optuna or
# pydantic). Checks each target and writes gpu_*.json, with the commit (git, else
# RAYBATCH_COMMIT) and a hash of the source, to RAYBATCH_RESULTS_DIR (default bench/results/):
#     RAYBATCH_COMMIT=<sha> RAYBATCH_RESULTS_DIR=<dir> make gpu-check
# Exit status (bench/gpu_offline.sh): 0 every target met (known misses aside); 1 a target missed,
# or a check crashed or ran out of its 7-minute budget; 2 no CUDA device here (it stops at once,
# runs nothing).
gpu-check:
	PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) bash bench/gpu_offline.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
