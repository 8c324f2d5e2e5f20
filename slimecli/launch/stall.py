"""The progress watchdog: a run whose trainer completes no step within run.stall_timeout_s is hung. Every
slimecli worker process then writes its Python stacks to its log (faulthandler, registered on SIGUSR1 by
observe/worker.py), and the supervisor fails the run naming them, so that a hang becomes a report.

Not launch/watchdog.py, which is the other direction: a worker that watches for its parent's death."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from slimecli.process import command_line, descendants, state

STACKS_SIGNAL = signal.SIGUSR1
_WORKER_MODULES = (b"slimecli.train", b"slimecli.engine", b"slimecli.teacher", b"slimecli.eval")


@dataclass
class StallWatch:
    """No step for ``timeout_s``: the progress file (RUN/metrics.jsonl, opened once the trainer is up, then a
    row a step) unchanged since its last change; until it first grows after the watch starts (the first step's
    row: a new run's file is created empty, a resumed run's rewritten), ``start_grace_s`` more are allowed
    (loading a model, and a first step's warm-up, may take that long)."""

    progress: Path
    timeout_s: float
    start_grace_s: float = 0.0
    _seen: tuple[float, int] | None = field(default=None, init=False)
    _since: float = field(default_factory=time.monotonic, init=False)
    _started: bool = field(default=False, init=False)  # the file changed since the watch began

    def __post_init__(self) -> None:
        self._seen = self._look()  # a resumed run's file as it was: not progress

    def rearm(self) -> None:
        """Count from now (the workers have just started); what the file held when the watch was made stays what
        progress is measured against, so a first step that completed meanwhile still counts as one."""
        self._since = time.monotonic()

    def stalled_for(self) -> float | None:
        """The seconds without progress once they pass the timeout, else None."""
        if self.timeout_s <= 0:
            return None
        seen, now = self._look(), time.monotonic()
        if seen != self._seen:
            # a new run's file may be created and get its first row between two looks: that is growth too
            grew = seen is not None and seen[1] > (self._seen[1] if self._seen is not None else 0)
            self._started, self._seen, self._since = self._started or grew, seen, now
        quiet = now - self._since
        allowed = self.timeout_s + (0.0 if self._started else self.start_grace_s)
        return quiet if quiet >= allowed else None

    def _look(self) -> tuple[float, int] | None:
        try:
            st = self.progress.stat()
        except OSError:
            return None
        return st.st_mtime, st.st_size


def dump_stacks(roots: list[int]) -> list[str]:
    """Ask every slimecli worker process under ``roots`` (the children the supervisor started) for its Python
    stacks; one line per process: what was asked of whom, or why its stacks could not be taken."""
    said = []
    for pid in descendants(roots):
        args = command_line(pid)
        joined = " ".join(args).encode()
        if not any(m in joined for m in _WORKER_MODULES) or b"torch.distributed.run" in joined:
            continue
        name = " ".join(args[1:4])
        if state(pid) == "T":
            said.append(f"pid {pid} ({name}): stopped (SIGSTOP): its stacks could not be taken")
            continue
        try:
            os.kill(pid, STACKS_SIGNAL)
            said.append(f"pid {pid} ({name}): stacks written to its log")
        except OSError as exc:
            said.append(f"pid {pid} ({name}): its stacks could not be taken ({exc.strerror})")
    return said


