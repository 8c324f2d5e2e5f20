"""Helpers shared by the tests: run the CLI as a user would, find free ports, wait for a condition or
for processes to end. Import them from here (`from tests.helpers import ...`); conftest.py keeps only
fixtures.

The submodules hold the helpers of one group of tests: `engine` (a real engine process and the fixtures
that start it), `train_e2e` (`slimecli train` runs as real processes), `teacher` (tiny checkpoints and a
teacher server), `hostile` (raw HTTP bytes and strategies for the hostile-input suites). Two are
programs run by path: `scripted_engine.py` (the agent protocol tests' scripted engine, also imported)
and `vocab_parallel_check.py` (run under torchrun by the vocab-parallel test).

Waiting is always on a condition with a deadline, never a fixed sleep before reading a file or a
state: `wait_until` polls until the condition holds and fails with what it waited for.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def _port_band() -> range:
    """The ports this test process picks from: below the kernel's ephemeral range (which outgoing connections
    and port-0 binds draw from, so a port picked there can be taken before its server binds it), split between
    the pytest-xdist workers so that two workers never pick the same one."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start, stop = 20000, max(low, 24000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index, count = int(worker[2:] or 0), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    width = (stop - start) // max(count, 1)
    return range(start + index * width, start + (index + 1) * width)


def free_port() -> int:
    """A loopback port nothing listens on now, for a server a test starts (see _port_band)."""
    band = _port_band()
    for port in random.sample(band, min(len(band), 200)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded band: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m slimecli ARGS` in a fresh interpreter, exactly as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "slimecli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or ROOT, timeout=timeout)


def run_ranks(helper: str, nproc: int, *args: str, timeout: float = 600, preload: tuple[str, ...] = ()) -> None:
    """tests/helpers/HELPER.py on `nproc` gloo ranks, launched as slimecli launches a node's trainer ranks
    (slimecli.launch.ranks: what torchrun gives each rank, the ranks forked once torch and `preload` are imported)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    more = ["--preload", ",".join(preload)] if preload else []
    argv = [sys.executable, "-m", "slimecli.launch.ranks", "--nproc", str(nproc), *more, "-m",
            f"tests.helpers.{helper}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def invoke_cli(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
               input: str | None = None) -> subprocess.CompletedProcess:
    """`slimecli ARGS` in this interpreter (typer's runner): the same exit code and streams as `run_cli`,
    without the ~0.5 s of a fresh interpreter. For what the command does, not for how the process starts
    (import time, the console script, signals: those keep `run_cli`).

    An exception that escapes the command is rendered into stderr as the real CLI would print it, so
    "no traceback" assertions hold for both."""
    import traceback

    from typer.testing import CliRunner

    from slimecli.cli.app import app

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    os.chdir(cwd or ROOT)
    try:
        result = CliRunner().invoke(app, list(args), input=input, catch_exceptions=True, prog_name="slimecli")
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(
            traceback.format_exception(result.exception)[1:])
    return subprocess.CompletedProcess(["slimecli", *args], result.exit_code, result.stdout, stderr)


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call `predicate` until it returns something truthy or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "the condition", *,
               interval: float = 0.05, proc: subprocess.Popen[Any] | None = None) -> T:
    """Poll `predicate` until it returns something truthy and return that value.

    Fails at the deadline naming `what`, or as soon as `proc` (whose output the condition waits
    for) has exited, with its output.
    """
    def check() -> T:
        value = predicate()
        if not value and proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout is not None else ""
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n{out}")
        return value

    value = poll(check, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
    return value


async def wait_until_async(predicate: Callable[[], Awaitable[T]], timeout: float, what: str = "the condition", *,
                           interval: float = 0.05) -> T:
    """`wait_until` for an async condition (e.g. a server's state read over HTTP) inside an event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {value!r})")
        await asyncio.sleep(interval)


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
    """Pids still alive after `timeout` (returns as soon as none is)."""
    poll(lambda: not any(pid_alive(p) for p in pids), timeout, interval=0.2)
    return [p for p in pids if pid_alive(p)]


def git(*args: str, cwd: Path) -> str:
    """`git ARGS` in `cwd` with no user or system config, a fixed author: what a test's own repository needs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()
