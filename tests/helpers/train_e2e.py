"""Helpers for end-to-end runs of `slimecli train` as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from slimecli.observe.metrics import read_metrics
from slimecli.process import command_line
from tests.helpers import ROOT, wait_dead


def train_argv(run_dir: Path, *overrides: str) -> list[str]:
    """`slimecli train` on the quickstart as a user runs it: its servers on free ports (port=auto, the default),
    so tests can run side by side. No report at the end (3 s of plotting a run) unless the overrides ask for it:
    the report tests read the shared quickstart run's."""
    return [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", "observe.report=false", *overrides]


def start_train(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(train_argv(run_dir, *overrides), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def run_train(run_dir: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(train_argv(run_dir, *overrides), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


QUICKSTART_STEPS = 48  # the shared quickstart run: long enough that the reward clearly rises


def shared_run(factory: pytest.TempPathFactory, name: str, *overrides: str) -> tuple[Path, str]:
    """A `slimecli train` run made once per test session, for the tests that only read it, and its stdout.

    Under pytest-xdist every worker asks for it; a lock in the directory the workers share makes the first one
    train and the others wait, so the run is made once whichever worker comes first. A run that failed fails
    every test that asked for it, each with the run's output."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above each worker's own
    run = root / "shared-runs" / name
    record = run.parent / f"{name}.json"
    run.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(run.parent / f"{name}.lock")):
        if not record.is_file():
            out = run_train(run, *overrides)
            record.write_text(json.dumps({"returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}))
    result = json.loads(record.read_text())
    assert result["returncode"] == 0, result["stdout"][-3000:] + result["stderr"][-3000:]
    return run, result["stdout"]


def quickstart_run(factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The quickstart trained for QUICKSTART_STEPS steps (evaluated at start and end, its report written, its
    final policy in final/): the learning test, the OPD teacher, evaluation and report tests read it."""
    return shared_run(factory, "quickstart", f"trainer.max_steps={QUICKSTART_STEPS}", "trainer.save_interval=0",
                      "observe.report=true")


def metrics(run_dir: Path) -> list[dict]:
    """The complete rows of the run's steps in its metrics.jsonl (a row still being written is skipped; row 0,
    the evaluation at start alone, is read_metrics()')."""
    return [row for row in read_metrics(run_dir) if row.get("step") != 0]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """Test clean-up: the controller's whole process group and anything below it."""
    pids = descendants(proc.pid)
    for sig_target in [proc.pid, *pids]:
        try:
            os.kill(sig_target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    wait_dead(pids, timeout=10)


def rank_pids(pids: list[int], module: bytes = b"slimecli.train") -> list[int]:
    """The rank processes among ``pids``: `-m module` in their command line, less the launcher that started them
    (torchrun, or slimecli.launch.ranks, whose forked ranks share its command line: it is their parent)."""
    found = [p for p in pids if b"-m\x00" + module in cmdline(p) and b"torch.distributed.run" not in cmdline(p)]
    parents = set()
    for pid in found:
        try:
            parents.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
        except (OSError, IndexError, ValueError):
            continue
    return [p for p in found if p not in parents]


def cmdline(pid: int) -> bytes:
    """A process's NUL-separated command line (b"" once it is gone), a template-forked one's split at its spaces
    (slimecli.process.command_line)."""
    args = command_line(pid)
    return b"\0".join(a.encode() for a in args) + b"\0" if args else b""
