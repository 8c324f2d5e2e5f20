"""Fixtures shared by the tests, and the suite's own bookkeeping: each test's duration is recorded in
`.test-durations.json` (docs/testing.md's table and tests/file_costs.json, the order files run in, are
made from it), and the end of the run names tests that took long without the `slow` marker. Helpers (run the CLI, free ports, waiting) live in tests/helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port

DURATIONS_FILE = ROOT / ".test-durations.json"
FILE_COSTS = ROOT / "tests" / "file_costs.json"  # seconds per test file, committed: the order files are run in
# projects the tests use as data (tests/data/tinystats-0.1.0: what `tasks synth` makes tasks from) carry their
# own tests, which run in their task's environment, not here
collect_ignore_glob = ["data/*"]
# the compose cache stays out of the suite (and the user's home): each command composes afresh, as it did;
# tests/test_compose_cache.py turns it on in a directory of its own
os.environ.setdefault("SLIMECLI_COMPOSE_CACHE", "off")
SLOW_S = 10.0  # a test whose call takes longer (its shared fixtures' set-up aside) should be marked slow
_durations: dict[str, float] = {}
_call_durations: dict[str, float] = {}
_slow_marked: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        # Each worker gets its share of the cores, and so does every process its tests start (an engine, trainer
        # ranks): an OpenMP region wider than the cores left free waits on whichever of its threads the other
        # worker's processes descheduled; with a core taken, a 2-thread engine made a tool-environment step 7x
        # slower than a 1-thread one, which is as fast on idle cores. What the environment sets wins.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        share = os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
        import torch

        torch.set_num_threads(int(share) if share.isdigit() and int(share) > 0 else 1)


def _file_cost(file: str, items: list[pytest.Item], recorded: dict[str, float]) -> float:
    """The file's seconds in the last recorded run (tests/file_costs.json), else a guess from its tests: a slow
    one (real processes) costs as much as 60 quick ones."""
    if file in recorded:
        return recorded[file]
    return sum(30.0 if item.get_closest_marker("slow") else 0.5 for item in items)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The costliest files first, each file's tests in their own order: pytest-xdist hands out whole files in this
    order, so the long ones start at once and the quick ones fill the gaps at the end (a long file last would
    run alone on one worker while the other idles)."""
    _slow_marked.update(item.nodeid for item in items if item.get_closest_marker("slow"))
    recorded = json.loads(FILE_COSTS.read_text()) if FILE_COSTS.is_file() else {}
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    cost = {file: _file_cost(file, its, recorded) for file, its in by_file.items()}
    items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Runs in the controller for every worker's reports too (pytest-xdist relays them)."""
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "call":
        _call_durations[report.nodeid] = report.duration
        if "slow" in report.keywords:
            _slow_marked.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not _durations:
        return
    if config.getoption("collectonly", False):
        return
    previous = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.is_file() else {}
    DURATIONS_FILE.write_text(json.dumps({**previous, **{k: round(v, 2) for k, v in _durations.items()}},
                                         indent=0, sort_keys=True))
    unmarked = sorted((v, k) for k, v in _call_durations.items() if v > SLOW_S and k not in _slow_marked)
    if unmarked:
        terminalreporter.write_sep("-", f"over {SLOW_S:g} s without the slow marker")
        for seconds, nodeid in reversed(unmarked):
            terminalreporter.write_line(f"{seconds:8.1f}s {nodeid}")


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly created tiny model directory (seed 0), shared by the tests that only read it."""
    from slimecli.model.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory):
    """A real engine process (`slimecli rollout serve`, tiny model, default settings) shared by the modules that
    only read from it; one that changes its state puts it back. Modules that need other settings, or break
    it on purpose, start their own."""
    from tests.helpers.engine import engine_fixture

    yield from engine_fixture(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="session")
def tok(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


@pytest.fixture(scope="session")
def plain_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a plain install (a non-editable `pip install .`, no extras: tests/helpers/plain_venv.py),
    made once per test session, whichever worker asks first."""
    from tests.helpers.plain_venv import shared_plain_install

    return shared_plain_install(tmp_path_factory.getbasetemp())
