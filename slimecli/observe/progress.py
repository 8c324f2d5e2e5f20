"""The training progress bar: step, and a caller-provided text such as the running mean reward.

On a terminal it is a rich progress bar; otherwise (logs, pipes, CI) each update is one plain line.
The reward text comes from slimecli.reward.stats.RewardMeter, which never fails on any reward value.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """``update(step, text)`` after each step. ``plain=None`` picks plain lines when ``file`` is not a TTY."""

    note_interval_s = 15.0

    def __init__(self, total: int, start: int = 0, *, description: str = "train", file: IO[str] | None = None,
                 plain: bool | None = None, console: Console | None = None) -> None:
        self.total = total
        self.description = description
        self.file = file if file is not None else sys.stdout
        self.console = console or Console(file=self.file)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self._started = time.monotonic()
        self._last_note = float("-inf")
        self._progress: Progress | None = None
        if not self.plain:
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                                      console=self.console, transient=False)
            self._task = self._progress.add_task(description, total=total, completed=start, info="")
            self._progress.start()

    def update(self, step: int, text: str = "") -> None:
        """``step`` = number of finished steps."""
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=text)
            return
        elapsed = time.monotonic() - self._started
        line = f"{self.description} step {step}/{self.total} [{elapsed:.0f}s]"
        print(f"{line} {text}".rstrip(), file=self.file, flush=True)

    def note(self, text: str) -> None:
        """Status within a step (agent runs finished and in flight): the bar's text on a terminal, else a
        plain line at most every `note_interval_s`."""
        if self._progress is not None:
            self._progress.update(self._task, info=text)
            return
        now = time.monotonic()
        if now - self._last_note >= self.note_interval_s:
            self._last_note = now
            print(f"{self.description} [{now - self._started:.0f}s] {text}", file=self.file, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
