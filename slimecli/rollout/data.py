"""Prompt sources with a resumable position: the quickstart task, JSONL datasets and SWE task files."""

from __future__ import annotations

import json
import logging
import random
from collections import deque
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from slimecli.config.groups.task import TaskConfig

log = logging.getLogger("slimecli.rollout")


# which rollout draws prompts now: the rollout pipeline sets it in the context of each step's rollout task, and
# the tasks that rollout starts inherit it, so several rollouts in flight keep apart which prompts each drew
DRAWER: ContextVar[int | None] = ContextVar("slimecli_rollout_drawer", default=None)


class PromptSource:
    """Hands out prompt records ({prompt, label, metadata, position}) in a fixed, seed-determined order; a
    record's position (its place in the run's stream of prompts, which a resume restores) names it for the
    sampling seeds of its samples.

    The ledger: the positions each rollout in flight has drawn (by DRAWER) until it is trained (settle). A
    checkpoint keeps them beside the next fresh position, and a resumed run re-issues them first, so that no
    position is trained twice or skipped."""

    def __init__(self, task: TaskConfig, seed: int):
        self.task = task
        self.seed = seed
        self.position = 0  # prompts handed out so far; saved in checkpoints
        self.drawn: dict[int, list[int]] = {}  # rollout (step) -> the positions it drew, not yet trained
        self.reissue: deque[int] = deque()  # positions a resumed run hands out again before fresh ones
        self._rows: list[dict[str, Any]] | None = None
        self._epoch_order: tuple[int, list[int]] | None = None
        if task.name == "jsonl":
            self._rows = _read_jsonl(Path(task.path or ""), task.prompt_key, task.label_key)
        elif task.name == "swe":
            self._rows = _read_swe(task.path or "", task.on_invalid, task.format, task.repos_dir)

    def take(self, n: int) -> list[int]:
        """The next n positions: re-issued ones first, then fresh ones; noted in the ledger of the drawing rollout."""
        out = [self.reissue.popleft() for _ in range(min(n, len(self.reissue)))]
        fresh = n - len(out)
        out += range(self.position, self.position + fresh)
        self.position += fresh
        drawer = DRAWER.get()
        if drawer is not None:
            self.drawn.setdefault(drawer, []).extend(out)
        return out

    def next(self, n: int) -> list[dict[str, Any]]:
        return [self.record(p) for p in self.take(n)]

    def record(self, position: int) -> dict[str, Any]:
        return {**self._record(position), "position": position}

    def settle(self, drawer: int) -> None:
        """Rollout ``drawer`` is trained: its prompts leave the ledger."""
        self.drawn.pop(drawer, None)

    def _record(self, index: int) -> dict[str, Any]:
        if self._rows is None:
            from slimecli.rollout.quickstart import make_prompt

            return make_prompt(self.seed, index)
        epoch, offset = divmod(index, len(self._rows))
        return dict(self._rows[self._order(epoch)[offset]])

    def _order(self, epoch: int) -> list[int]:
        """The epoch's permutation, computed once per epoch."""
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            order = list(range(len(self._rows or [])))
            if self.task.shuffle:
                random.Random(self.seed + epoch).shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def state_dict(self) -> dict[str, Any]:
        """The next fresh position, and the positions drawn but not trained (in flight), oldest rollout first."""
        pending = [p for _, positions in sorted(self.drawn.items()) for p in positions]
        return {"position": self.position, "reissue": [*self.reissue, *pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
        self.reissue = deque(int(p) for p in state.get("reissue", ()))
        self.drawn = {}


def jsonl_objects(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-empty line of a JSONL file; a line that is not a JSON object is a
    ValueError naming the file and line."""
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(item, dict):
                raise ValueError(f"{path}:{line_no}: a row must be a JSON object")
            rows.append((line_no, item))
    return rows


def _read_jsonl(path: Path, prompt_key: str, label_key: str) -> list[dict[str, Any]]:
    rows = []
    for line_no, item in jsonl_objects(path):
        if prompt_key not in item:
            raise ValueError(f"{path}:{line_no}: no '{prompt_key}' field (task.prompt_key); keys: {sorted(item)}")
        meta = {k: v for k, v in item.items() if k not in (prompt_key, label_key)}
        rows.append({"prompt": item[prompt_key], "label": item.get(label_key), "metadata": meta})
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def _read_swe(path: str, on_invalid: str = "error", format: str = "auto",
              repos_dir: str | None = None) -> list[dict[str, Any]]:
    """SWE task rows as records: the problem statement is the prompt, the task itself rides along.

    Bad rows (task.on_invalid): `error` refuses the file (the task rules did so before launch; this catches a
    file changed since), `skip` leaves them out and says how many.
    """
    from slimecli.swe.task import load

    loaded = load(path, format, repos_dir)
    tasks = loaded.tasks
    bad_rows = len({e.source for e in loaded.errors})  # a row may have several bad fields
    if bad_rows and on_invalid == "error":
        raise ValueError(f"{path}: {bad_rows} bad task row(s), first {loaded.errors[0].render()} "
                         "(task.on_invalid=error; task.on_invalid=skip skips and counts them)")
    if bad_rows:
        log.warning("%s: %d bad task row(s) skipped (task.on_invalid=skip)", path, bad_rows)
    if not tasks:
        raise ValueError(f"{path}: no valid SWE task")
    return [{"prompt": t.problem_statement, "label": None, "task": t, "metadata": {"instance_id": t.instance_id}}
            for t in tasks]
