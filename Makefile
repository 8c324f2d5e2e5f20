# Set-up is part of every target: a fresh machine needs only Python 3.11+ (and node/npm for the agent CLIs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch; GPU users install their own torch first (pyproject accepts torch>=2.4).
TORCH ?= torch==2.13.0
MEGATRON ?= megatron-core==0.16.1

.PHONY: setup agent-clis train test lint bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]" "$(MEGATRON)"
	touch $@

setup: $(BIN)/.installed

train: setup
	$(BIN)/slimecli train $(ARGS)

# The real agent CLIs (pinned npm packages) that the agent tests run against.
agent-clis: setup
	$(BIN)/slimecli agent install claude_code
	$(BIN)/slimecli agent install codex

test: setup agent-clis
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done
