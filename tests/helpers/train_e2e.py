"""Helpers for end-to-end runs of `slimecli train` as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from slimecli.observe.metrics import read_metrics
from tests.helpers import ROOT, free_port, wait_dead


def train_argv(run_dir: Path, *overrides: str) -> list[str]:
    """`slimecli train` on the quickstart with free ports, so tests can run side by side."""
    return [sys.executable, "-m", "slimecli", "train", f"run.dir={run_dir}", f"rollout.port={free_port()}", *overrides]


def start_train(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(train_argv(run_dir, *overrides), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def run_train(run_dir: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(train_argv(run_dir, *overrides), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def metrics(run_dir: Path) -> list[dict]:
    """The complete rows of the run's metrics.jsonl (a row still being written is skipped)."""
    return read_metrics(run_dir)


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


def cmdline(pid: int) -> bytes:
    """A process's NUL-separated command line (b"" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
