# Set-up is part of every target: a fresh machine needs only Python 3.11+ (and node/npm for the agent CLIs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch; GPU users install their own torch first (pyproject accepts torch>=2.6). It must match
# the torch line of constraints.txt (GPU builds of the same release do: torch==2.13.0 matches 2.13.0+cu128).
TORCH ?= torch==2.13.0
# constraints.txt: every package of the environment CI tested, pinned (`make constraints` writes it), so a fresh
# machine installs exactly what CI ran. `make setup CONSTRAINTS=` resolves afresh within pyproject's ranges instead.
CONSTRAINTS ?= constraints.txt
# pip compiles every module it installs to bytecode on one core (two thirds of the set-up's time); compileall does the
# same work afterwards on every core. Compiled, not left to the first import: with PYTHONDONTWRITEBYTECODE set, every
# process would compile what it imports again. The tests compile nothing ahead: their processes write the bytecode of
# what they import, once, under .cache/pycache (never beside a source, so not into a task's workspace either).
PIP_C := $(BIN)/pip install -q --no-compile $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# A few files written for other Python versions do not compile; pip skips them too.
COMPILE := $(BIN)/python -m compileall -qq -j0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
NEW_VENV := test -x $(BIN)/pip || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip; }

.PHONY: setup agent-clis sandbox-deps sglang-contract wheelhouse train test test-deps test-quick test-durations lint bench constraints

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	$(NEW_VENV)
	$(PIP_C) "$(TORCH)" -e ".[dev]"
	touch $@

# The venv compiled for the commands run from it (make train, bench, .venv/bin/slimecli), whichever pip run installed it.
$(BIN)/.compiled: $(BIN)/.installed
	$(COMPILE)
	touch $@

# megatron-core (trainer=megatron, the stateless Adam patch), wandb (observe.wandb, tested offline) and the hubs'
# environment libraries (env=verifiers|openenv|skyrl_gym|reasoning_gym) only for the tests, not in every user's
# set-up. On a fresh machine this is the whole set-up of make test, in one pip run (one resolution, not three).
$(BIN)/.installed-megatron: pyproject.toml $(CONSTRAINTS)
	$(NEW_VENV)
	$(PIP_C) "$(TORCH)" -e ".[dev,megatron,wandb,envs]"
	touch $(BIN)/.installed $@

setup: $(BIN)/.compiled

train: setup
	$(BIN)/slimecli train $(ARGS)

# The real agent CLIs (pinned npm packages) that the agent tests run against.
agent-clis: $(BIN)/.installed
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

# SGLang's own argument parser and request schemas for tests/test_sglang_contract.py, without a GPU: the sglang
# wheel and the few pure-Python packages its server_args and io_struct modules import, without their
# dependencies, in a directory of their own (sglang pins another torch and transformers: the venv keeps its own).
# GPU-only modules (triton, ...) are stubbed by the tests. ~40 MB download, once. Not compiled to bytecode: the
# tests import a few dozen of its 6,000 modules, about 1 CPU-second to compile as they do, against 18 for pip to
# compile them all on one core before the suite starts.
SGLANG_CONTRACT ?= .cache/sglang-contract
SGLANG_PKGS := sglang==0.5.23 orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 msgspec==0.23.0 pyzmq==27.3.0 \
  dill==0.4.1 sentencepiece==0.2.1 compressed-tensors==0.18.0 loguru==0.7.3 gguf==0.19.0 openai==2.8.0 \
  partial_json_parser==0.2.1.1.post7
$(SGLANG_CONTRACT)/.installed:
	$(BIN)/pip install -q --no-compile --no-deps --target $(SGLANG_CONTRACT) $(SGLANG_PKGS)
	touch $@

sglang-contract: $(BIN)/.installed $(SGLANG_CONTRACT)/.installed

# The wheels bench/gpu_check.sh --offline installs on a GPU machine without a network (Python 3.11 and 3.12,
# at most 60 MiB; the machine's torch and transformers are reused): bench/wheelhouse.py says what is left out.
# WHEELHOUSE_ALL=1 keeps everything.
WHEELHOUSE ?= wheelhouse
wheelhouse: $(BIN)/.installed
	$(BIN)/python bench/wheelhouse.py --out $(WHEELHOUSE) $(if $(WHEELHOUSE_ALL),--all)

# The suite runs on TEST_WORKERS pytest-xdist workers, a test file per worker at a time (a file's module-scoped
# engines and servers are started once), costliest first (tests/conftest.py orders them; xdist keeps that order); each test's duration goes to .test-durations.json and the 15 slowest
# are printed at the end (docs/testing.md: how the time is spent; make test-durations prints its table).
# What the suite needs beside the venv is installed side by side (the installs are independent), and mypy checks
# the types while the suite runs: both must pass, its report is printed only when it fails, so the run still ends
# with the slowest tests. mypy keeps its incremental cache in the user's cache directory, shared by every checkout
# of this machine: from scratch it takes a core for a minute (57 CPU-s of the suite's two cores), with the cache of
# an earlier run 2 CPU-s (it re-checks what changed since, by content, and what depends on it).
MYPY_CACHE ?= $${XDG_CACHE_HOME:-$$HOME/.cache}/slimecli/mypy
MYPY := $(BIN)/python -m mypy --cache-dir "$(MYPY_CACHE)"
TEST_WORKERS ?= 2
PYCACHE := .cache/pycache
TEST_BYTECODE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/$(PYCACHE)
# A run's temporary files (task workspaces, the plain install's venv: ~115 MB of bytecode) are new paths each run:
# their bytecode is dropped before the next, the checkout's own (the venv's included) kept.
PRUNE_PYCACHE := keep="$(PYCACHE)$(CURDIR)"; if [ -d "$$keep" ]; then mv "$$keep" "$(PYCACHE).keep"; fi; \
  rm -rf "$(PYCACHE)"; if [ -d "$(PYCACHE).keep" ]; then mkdir -p "$$(dirname "$$keep")" && mv "$(PYCACHE).keep" "$$keep"; fi
test-deps: agent-clis sandbox-deps sglang-contract

test: $(BIN)/.installed-megatron
	@$(MAKE) --no-print-directory -j4 test-deps
	$(BIN)/ruff check .
	@$(PRUNE_PYCACHE)
	@types=$$(mktemp); $(MYPY) > $$types 2>&1 & mypy=$$!; \
	$(TEST_BYTECODE) $(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS); \
	tests=$$?; if wait $$mypy; then rm -f $$types; else cat $$types; rm -f $$types; echo "mypy failed"; exit 1; fi; \
	exit $$tests

# The inner loop: everything but the tests marked slow (real training runs, servers, the agent CLIs).
test-quick: $(BIN)/.installed
	@$(PRUNE_PYCACHE)
	$(TEST_BYTECODE) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

test-durations:
	@$(BIN)/python -m tests.helpers.durations_table 30

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(MYPY)

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Rewrite constraints.txt from .venv once `make test` has passed there: pip freeze without slimecli itself, without
# CUDA wheels (nvidia-*, triton: the torch build brings its own) and with torch's local label (+cpu) dropped.
# To move to newer releases: upgrade them in .venv (.venv/bin/pip install -U PKG, within pyproject's ranges), run
# make test, then make constraints.
constraints:
	@$(BIN)/pip show -q megatron-core >/dev/null 2>&1 || { echo "the megatron extra is not in $(VENV): run make test first"; exit 1; }
	{ echo "# Generated by make constraints from the environment CI tested; make setup and make test install with -c."; \
	  $(BIN)/pip freeze --all --exclude-editable --exclude pip | grep -v -E '^(nvidia-|triton==|-e |#)' | \
	  sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
