"""Shared test helpers: run the CLI as a user would, find free ports, wait for processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m slimecli ARGS` in a fresh interpreter, exactly as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "slimecli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or ROOT, timeout=timeout)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return False


def host_processes_with(marker: str) -> list[int]:
    """Live processes (other than this one) whose command line contains `marker`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [p for p in found if p != os.getpid() and pid_alive(p)]


def wait_dead(pids: list[int], timeout: float = 20.0) -> list[int]:
    """Pids still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return [p for p in pids if pid_alive(p)]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly created tiny model directory (seed 0), shared by the tests that only read it."""
    from slimecli.model.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="session")
def tok(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))
