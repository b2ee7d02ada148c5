# Two entry points for a fresh machine: `make run` (the main job) and `make test` (the tests).
# Each creates .venv/ and installs what it needs into it; nothing is installed system-wide.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# The CPU tests cross-check autotune's rules against megatron-core itself.
TORCH_SPEC ?= torch==2.13.0
# Where the CPU build of torch comes from: PyPI's Linux torch is the CUDA build (gigabytes of
# NVIDIA libraries the tests never use); PyTorch's CPU index has 2.13.0+cpu, which pip prefers
# to PyPI's 2.13.0 (a local version sorts after its public one). Where pip is configured with
# its own index or wheel folder (`pip config list`: a site mirror, an offline machine) that
# configuration is trusted and no index is added; `make test TORCH_INDEX_URL=...` overrides.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?= $(if $(shell $(PY) -m pip config list 2>/dev/null | \
	grep -E '\.(find-links|index-url|extra-index-url)='),,$(TORCH_CPU_INDEX))
TORCH_INDEX = $(if $(strip $(TORCH_INDEX_URL)),--extra-index-url $(TORCH_INDEX_URL))
MCORE_SPEC ?= megatron-core==0.16.1
MODEL ?= gpt2-xl
GPUS ?= 8
ARGS ?=

.PHONY: run test lint typecheck venv clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.base: pyproject.toml | $(VENV)/bin/python
	$(PIP) -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(VENV)/bin/python
	$(PIP) $(TORCH_INDEX) "$(TORCH_SPEC)" "$(MCORE_SPEC)"
	$(PIP) -e ".[dev]"
	touch $@

venv: $(VENV)/.base

# The main job: search the fastest layout of $(MODEL) on $(GPUS) GPUs. On a machine with
# NVIDIA GPUs the worker's dependencies (torch, megatron-core) are installed too; without GPUs
# autotune says so and plans with its analytical models.
run: $(VENV)/.base
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PIP) -e ".[megatron]"; fi
	$(VENV)/bin/autotune $(MODEL) --gpus $(GPUS) $(ARGS)

# The tests spread over the machine's cores, at most 4 (pytest-xdist; 2 cores: 2 workers), each
# test file in one worker: a file's module fixtures are built once, and test_postgres.py's
# shared database is used by one process at a time. `make test PYTEST_WORKERS=0` runs them in
# this process, one after another.
PYTEST_WORKERS ?= auto
test: $(VENV)/.test
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

lint: $(VENV)/.test
	$(VENV)/bin/ruff check autotune tests

typecheck: $(VENV)/.test
	$(VENV)/bin/mypy autotune

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
