"""The training progress bar: step, ETA, and a caller-provided text such as the step's reward and the mean of
the last few steps' (reward_text), plus the last evaluation when the step's metrics are given.

On a terminal it is a rich progress bar; otherwise (logs, pipes, CI) each update is one plain line. Under
`slimecli train` the trainer's output is a pipe: the controller draws the bar on its own terminal from
RUN/metrics.jsonl (observe/follow.py) and sets SLIMECLI_PROGRESS=controller, and the trainer's step lines
are then left out (metrics.jsonl has every number they would show).
The reward text comes from slimecli.reward.stats.RewardMeter, which never fails on any reward value.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from collections.abc import Mapping
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PROGRESS_ENV = "SLIMECLI_PROGRESS"  # "controller": the controller shows the progress; step lines are left out
REWARD_WINDOW = 10  # steps in the progress line's mean reward


class RecentRewards:
    """The mean of the last ``window`` steps' rewards: unlike a mean over the whole run, it moves when the
    policy does, so the progress line shows where training is now."""

    def __init__(self, window: int = REWARD_WINDOW) -> None:
        self.window = window
        self._values: deque[float] = deque(maxlen=window)

    def add(self, step_reward: object) -> None:
        """A step's mean reward; a step without one (all rewards invalid, no samples) is not counted."""
        if isinstance(step_reward, int | float) and not isinstance(step_reward, bool) and math.isfinite(step_reward):
            self._values.append(float(step_reward))

    def seed(self, rows: list[dict[str, Any]], up_to: int) -> None:
        """A resumed run's window: the rewards of its metrics rows up to step ``up_to`` (what it trained before)."""
        for row in rows:
            step = row.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and step <= up_to:
                self.add(row.get("reward/mean"))

    def text(self) -> str:
        """'reward (last 10) 0.950' ('' before the first reward)."""
        if not self._values:
            return ""
        return f"reward (last {self.window}) {sum(self._values) / len(self._values):.3f}"


def reward_text(step_reward: object, recent: RecentRewards) -> str:
    """'step reward 1.000 | reward (last 10) 0.950': the same words on a terminal's bar and in plain lines."""
    parts = []
    if isinstance(step_reward, int | float) and not isinstance(step_reward, bool) and math.isfinite(step_reward):
        parts.append(f"step reward {step_reward:.3f}")
    if recent.text():
        parts.append(recent.text())
    return " | ".join(parts)


def eval_text(metrics: Mapping[str, Any]) -> str:
    """'eval quickstart 0.812' from a metrics row's eval/<name>/reward_mean keys ('' when there are none)."""
    parts = []
    for key, value in metrics.items():
        name, _, metric = str(key).removeprefix("eval/").rpartition("/")
        if str(key).startswith("eval/") and metric == "reward_mean" and name and isinstance(value, int | float) \
                and not isinstance(value, bool) and math.isfinite(value):
            parts.append(f"{name} {value:.3f}")
    return f"eval {', '.join(parts)}" if parts else ""


def eta_text(elapsed_s: float, done: int, remaining: int) -> str:
    """'ETA 1m05s' from the pace so far ('' before the first step of this process)."""
    if done <= 0 or remaining < 0:
        return ""
    s = round(elapsed_s / done * remaining)
    return f"ETA {s // 60}m{s % 60:02d}s" if s >= 60 else f"ETA {s}s"


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
        self.quiet = os.environ.get(PROGRESS_ENV) == "controller" and plain is None
        self.start = start
        self.last_eval = ""
        self._started = time.monotonic()
        self._last_note = float("-inf")
        self._progress: Progress | None = None
        if not self.plain and not self.quiet:
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                      TextColumn("{task.fields[info]}"),
                                      console=self.console, transient=False)
            self._task = self._progress.add_task(description, total=total, completed=start, info="")
            self._progress.start()

    def update(self, step: int, text: str = "", metrics: Mapping[str, Any] | None = None) -> None:
        """``step`` = number of finished steps; ``metrics``: the step's row, for the last evaluation's rewards."""
        if metrics is not None:
            self.last_eval = eval_text(metrics) or self.last_eval
        if self.last_eval:
            text = f"{text} | {self.last_eval}" if text else self.last_eval
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=text)
            return
        if self.quiet:
            return
        elapsed = time.monotonic() - self._started
        eta = eta_text(elapsed, step - self.start, self.total - step)
        line = f"{self.description} step {step}/{self.total} [{elapsed:.0f}s{', ' + eta if eta else ''}]"
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
