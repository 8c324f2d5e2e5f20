# Set-up is part of every target: a fresh machine needs only Python 3.11+ (and node/npm for the agent CLIs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch; GPU users install their own torch first (pyproject accepts torch>=2.4).
TORCH ?= torch==2.13.0
MEGATRON ?= megatron-core==0.16.1

.PHONY: setup agent-clis sandbox-deps train test lint bench

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

# bubblewrap for sandbox=bwrap (the default where it works): installed when missing and this user may
# (root or passwordless sudo, with apt-get; a failed install then fails); otherwise the bwrap tests are skipped
# and say why.
sandbox-deps:
	@if command -v bwrap >/dev/null 2>&1; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "bubblewrap missing and no apt-get: sandbox=bwrap tests will be skipped (install bubblewrap)"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else \
	  echo "bubblewrap missing and no root or passwordless sudo: sandbox=bwrap tests will be skipped"; exit 0; fi; \
	$$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -qq >/dev/null 2>&1 && $$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
	  { echo "could not install bubblewrap with apt-get"; exit 1; }

test: setup agent-clis sandbox-deps
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/python -m mypy

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done
