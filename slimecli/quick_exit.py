"""Ending a process that has torch and transformers loaded without the interpreter's teardown of every module.

That teardown frees each module's objects one by one: about a second of CPU with torch and transformers loaded,
paid by every engine as it stops, every evaluator and trainer rank as it ends, and every command that loaded a
tokenizer; nothing a program can see depends on it once its threads, atexit functions and open files are done.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import Any, NoReturn

BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def exit_code(exc: SystemExit) -> int:
    """The status `python` exits with for this SystemExit (a message is printed and counts as 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def exit_now(code: int, signum: int | None = None) -> NoReturn:
    """End as the interpreter would (exit status ``code``, or killed by ``signum``), less its teardown of every
    module: the non-daemon threads joined, the atexit functions run, the logging handlers and every file still
    open flushed (the teardown would have flushed them as it freed them)."""
    import atexit
    import gc
    import logging
    import threading

    # as the interpreter does first: the threading atexit hooks (an executor's idle workers are told to end
    # there), then every non-daemon thread joined
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    # the standard streams by name: a child forked from a template (launch/template.py) inherits them among the
    # frozen objects, which gc.get_objects() leaves out
    streams: list[Any] = [s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None]
    for stream in streams + [o for o in gc.get_objects() if type(o) in BUFFERED]:  # with torch: 0.03-0.12 s, ms if frozen
        try:
            if not stream.closed and stream.writable():
                stream.flush()
        except (OSError, ValueError):
            pass
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code)
