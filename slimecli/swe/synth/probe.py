"""The pytest plugin synthesis loads into the repository's own test run, inside the task's sandbox.

It is copied next to the run as `slimecli_synth_probe.py` (suite.PROBE_MODULE) and imports nothing of slimecli
(the task's venv does not have it); slimecli never imports it (slimecli's interpreter need not have pytest). It records every test's outcome and the message a user would see when it fails (pytest's crash
line: exception type and assertion text), and, with SLIMECLI_PROBE_COVER=1, which lines each test ran: coverage.py
measures the whole session and switches its context to the test's node id around each test, so lines run at
import or collection carry the empty context. The result is one JSON file, SLIMECLI_PROBE_OUT.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
_results: dict[str, dict[str, str]] = {}
_collect_errors: dict[str, str] = {}
_cov: Any = None


def _message(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return text[:2000]


def pytest_configure(config: Any) -> None:
    global _cov
    if os.environ.get("SLIMECLI_PROBE_COVER") == "1":
        import coverage

        _cov = coverage.Coverage(data_file=None, include=[os.path.join(os.getcwd(), "*")], config_file=False)
        _cov.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    if _cov is not None:
        _cov.switch_context(item.nodeid)
    yield
    if _cov is not None:
        _cov.switch_context("")


def pytest_runtest_logreport(report: Any) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if report.passed:
        return
    if report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "failed"
    else:
        outcome = "error"
    if _RANK[outcome] > _RANK[entry["outcome"]]:
        entry["outcome"] = outcome
        entry["message"] = "" if outcome == "skipped" else _message(report)


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _collect_errors[report.nodeid] = _message(report)


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get("SLIMECLI_PROBE_OUT")
    if not out:
        return
    result: dict[str, Any] = {"tests": _results, "collect_errors": _collect_errors}
    if _cov is not None:
        _cov.stop()
        data = _cov.get_data()
        root = os.getcwd()
        contexts: dict[str, int] = {}
        lines: dict[str, dict[int, list[int]]] = {}
        for path in sorted(data.measured_files()):
            by_line = data.contexts_by_lineno(path)
            rel = os.path.relpath(path, root)
            lines[rel] = {n: sorted(contexts.setdefault(c, len(contexts)) for c in ctx) for n, ctx in by_line.items()}
        result["contexts"] = sorted(contexts, key=contexts.__getitem__)
        result["coverage"] = lines
    with open(out, "w") as f:
        json.dump(result, f)
