"""Start a command that the kernel signals when its parent dies: `python pdeathsig.py PPID SIG ARGV...`.

Popen's `preexec_fn` runs Python between fork and exec, which is unsafe in a parent that runs
threads (the supervisor's log pumps: a lock held by another thread at fork time stays held in
the child forever). So the supervisor starts each child through this program instead: it asks
for the parent-death signal (Linux prctl(PR_SET_PDEATHSIG)), makes sure the parent has not died
already (a death before the prctl sends no signal: then the parent is no longer PPID), and execs
the real command, which keeps the pid, the process group and the death signal.

Standard library only, and run with `python -I -S` by path, so that nothing on the child's
sys.path (its working directory, PYTHONPATH) can shadow what it imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import NoReturn

PR_SET_PDEATHSIG = 1
CANNOT_EXECUTE, NOT_FOUND = 126, 127  # what a shell answers


def command(argv: list[str], parent: int | None = None, sig: int = signal.SIGTERM) -> list[str]:
    """`argv`, started so that it gets `sig` when `parent` (default: this process) dies.

    The signal follows the thread that starts the child: start it from a thread that lives as
    long as the child should (the supervisor's main thread).
    """
    parent = os.getpid() if parent is None else parent
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(parent), str(int(sig)), *argv]


def prctl(option: int, value: int) -> bool:
    """Linux's prctl(option, value); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        call = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    call.restype = ctypes.c_int
    return int(call(option, value, 0, 0, 0)) == 0


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel for `sig` when our parent dies; False where that is not available."""
    return prctl(PR_SET_PDEATHSIG, sig)


def main(args: list[str]) -> NoReturn:
    if len(args) < 3:
        sys.stderr.write("usage: pdeathsig.py PPID SIG COMMAND [ARG...]\n")
        os._exit(2)
    parent, sig, argv = int(args[0]), int(args[1]), args[2:]
    if set_parent_death_signal(sig) and os.getppid() != parent:
        os._exit(128 + sig)  # the parent is already gone: the child must not outlive it
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):  # ignored by Python at start-up; an exec would keep that
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"slimecli: cannot run {argv[0]}: {exc.strerror or exc}\n")
        sys.stderr.flush()
        os._exit(NOT_FOUND if isinstance(exc, FileNotFoundError) else CANNOT_EXECUTE)


if __name__ == "__main__":
    main(sys.argv[1:])
