"""The training progress bar: step, and a caller-provided text such as the running mean reward.

On a terminal it is a rich progress bar; otherwise (logs, pipes, CI) each update is one plain line.
``RunningMean`` turns any rewards into that text without ever failing on a non-numeric one (dict rewards
are read through a key when given, other values are skipped and counted).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slimecli.observe.metrics import as_number


class RunningMean:
    """Mean of every numeric reward seen so far (and of the last ``window`` steps)."""

    def __init__(self, key: str | None = None, window: int = 10) -> None:
        self.key = key
        self.window = window
        self.total = 0.0
        self.count = 0
        self.skipped = 0
        self._recent: list[float] = []

    def value_of(self, reward: Any) -> float | None:
        if isinstance(reward, Mapping):
            reward = reward.get(self.key) if self.key is not None else None
        number = as_number(reward)
        return number if number is not None and math.isfinite(number) else None

    def update(self, rewards: Iterable[Any]) -> float | None:
        """Add one step's rewards; returns that step's numeric mean (None if none was numeric)."""
        values = []
        for r in rewards:
            v = self.value_of(r)
            if v is None:
                self.skipped += 1
            else:
                values.append(v)
        if not values:
            return None
        step_mean = sum(values) / len(values)
        self.total += sum(values)
        self.count += len(values)
        self._recent = [*self._recent, step_mean][-self.window:]
        return step_mean

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    @property
    def recent(self) -> float | None:
        return sum(self._recent) / len(self._recent) if self._recent else None

    def text(self) -> str:
        if self.mean is None:
            return "reward n/a"
        return f"reward {self.recent:.3f} (last {len(self._recent)}) mean {self.mean:.3f}"


class StepProgress:
    """``update(step, text)`` after each step. ``plain=None`` picks plain lines when ``file`` is not a TTY."""

    def __init__(self, total: int, start: int = 0, *, description: str = "train", file: IO[str] | None = None,
                 plain: bool | None = None, console: Console | None = None) -> None:
        self.total = total
        self.description = description
        self.file = file if file is not None else sys.stdout
        self.console = console or Console(file=self.file)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self._started = time.monotonic()
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

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
