"""Ending a process without the interpreter's teardown (slimecli/quick_exit.py): the forked children of the run's
template, the engine as it stops and the commands that loaded torch end this way."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from slimecli.quick_exit import exit_code
from tests.helpers import ROOT


def test_ending_without_the_teardown_loses_nothing_it_wrote(tmp_path):
    """exit_now(): what the interpreter's exit does that a program can see (non-daemon threads joined, atexit run,
    files still open flushed, an executor's idle workers ended, the exit status or the signal), less the teardown of every module."""
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from slimecli.quick_exit import exit_now
        left_open = open({str(tmp_path / 'open.txt')!r}, "w")
        left_open.write("buffered, never closed")
        atexit.register(lambda: open({str(tmp_path / 'atexit.txt')!r}, "w").write("ran"))
        def late():
            time.sleep(0.5)
            open({str(tmp_path / 'thread.txt')!r}, "w").write("joined")
        threading.Thread(target=late).start()
        from concurrent.futures import ThreadPoolExecutor
        idle = ThreadPoolExecutor(1)  # never shut down: its idle worker is told to end, as at the interpreter's exit
        idle.submit(time.sleep, 0).result()
        print("on stdout", end="")
        exit_now(int(sys.argv[1]), int(sys.argv[2]) or None)
    """)
    out = subprocess.run([sys.executable, "-c", script, "7", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 7 and out.stdout == "on stdout", out.stderr
    assert (tmp_path / "open.txt").read_text() == "buffered, never closed"
    assert (tmp_path / "atexit.txt").read_text() == "ran" and (tmp_path / "thread.txt").read_text() == "joined"
    killed = subprocess.run([sys.executable, "-c", script, "1", str(int(signal.SIGINT))], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGINT and killed.stdout == "on stdout"


def test_exit_codes_are_the_interpreters():
    assert exit_code(SystemExit()) == 0 and exit_code(SystemExit(None)) == 0
    assert exit_code(SystemExit(3)) == 3 and exit_code(SystemExit(256 + 2)) == 2
    assert exit_code(SystemExit("a message")) == 1
