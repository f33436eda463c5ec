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

.PHONY: setup demo test lint bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,examples]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/raybatch search raybatch.examples.tabular:workload --target "accuracy>=0.87" \
		--trials 12 --max-time-per-trial 20 --run-dir runs/demo-$$(date +%Y%m%d-%H%M%S)

lint: $(STAMP)
	$(BIN)/ruff check raybatch tests examples bench
	$(BIN)/ruff format --check raybatch tests examples bench
	$(BIN)/mypy

# Two processes, a test file each at a time (--dist loadfile): most of the suite waits on Ray and
# on subprocesses, so two cores finish it in a little over half the time of one. Every test
# process starts a Ray of its own (address="local"), so the two never share one.
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/python bench/search_efficiency.py
	$(BIN)/python bench/real_training.py
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

# Every GPU verification, on a machine with an NVIDIA GPU (a CUDA build of torch: set
# TORCH_PIN to one); writes bench/results/gpu_*.json and renders them into docs/benchmarks.md.
# No set-up and no index: it runs on an offline GPU machine's own python (bench/gpu_offline.sh).
gpu-check:
	PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) bash bench/gpu_offline.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
