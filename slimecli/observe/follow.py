"""The controller's progress bar: `slimecli train` on a terminal follows RUN/metrics.jsonl as the trainer writes
it and draws one rich bar (step, ETA, step reward, mean of the last steps' rewards, last eval) under the children's log lines.

The trainer's own output reaches the controller through a pipe, so only the controller can draw on the
terminal; it sets SLIMECLI_PROGRESS=controller for its children (observe/progress.py), so the trainer does
not print the same steps as lines too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from slimecli.observe.metrics import METRICS_FILE
from slimecli.observe.progress import RecentRewards, eval_text, reward_text

log = logging.getLogger(__name__)


class _BarAndInfo(Progress):
    """The bar on one line (step, elapsed, ETA), the rewards and the last eval on the next: fits 80 columns."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            info = task.fields.get("info")
            if info:
                yield Text(f"  {info}", overflow="fold")


class MetricsFollower:
    """``start()`` a thread that polls ``run_dir()`` (None until the run directory exists) for new metrics rows
    and shows them on ``console``'s bar; ``stop()`` reads what is left and removes the bar's thread."""

    def __init__(self, console: Console, total: int, run_dir: Callable[[], Path | None], *,
                 poll_s: float = 0.5, description: str = "train") -> None:
        self.console = console
        self.total = total
        self.run_dir = run_dir
        self.poll_s = poll_s
        self.rows = 0
        self.last_eval = ""
        self._rewards = RecentRewards()
        self._offset = 0
        self._path: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.progress = _BarAndInfo(TextColumn("[bold]{task.description}"), BarColumn(bar_width=30),
                                    MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                                    TimeRemainingColumn(), console=console, transient=False)
        self._task = self.progress.add_task(description, total=total, completed=0, info="starting", start=False)

    def start(self) -> MetricsFollower:
        self.progress.start()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="progress-follower")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.poll()
        self.progress.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a bar that fails must not stop the run; the logs have everything
                log.warning("progress display stopped: %s: %s", type(exc).__name__, exc)
                return

    def poll(self) -> None:
        """Read the rows appended since the last poll (a line still being written waits for the next)."""
        if self._path is None:
            found = self.run_dir()
            if found is None:
                return
            self._path = found / METRICS_FILE
        if not self._path.is_file():
            return
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        self._offset += end + 1
        for line in data[: end + 1].splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                self.show(row)

    def show(self, row: dict[str, Any]) -> None:
        step = row.get("step")
        if not isinstance(step, int):
            return
        if self.rows == 0:
            self.progress.reset(self._task, completed=step, total=self.total)  # a resumed run starts further on
            self.progress.start_task(self._task)
        self.rows += 1
        reward = row.get("reward/mean")
        self._rewards.add(reward)
        self.last_eval = eval_text(row) or self.last_eval
        parts = [text] if (text := reward_text(reward, self._rewards)) else []
        if self.last_eval:
            parts.append(self.last_eval)
        self.progress.update(self._task, completed=step, info=" | ".join(parts))
