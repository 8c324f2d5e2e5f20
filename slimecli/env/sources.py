"""The run's environments as sources: env=KIND env.id=ID is one source, env.mix several, each with its label; their
tasks as one stream of records in a fixed, resumable order.

A record's source is picked by its position in the run's stream (a golden-ratio sequence over the sources'
ratios: every window of positions holds each source in about its share), and its row by the same position in
that source's own order, so a resume (which restores the position) draws exactly what the run would have drawn.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from slimecli.config.groups.env import EnvConfig, EnvSourceConfig
from slimecli.config.groups.task import TaskConfig
from slimecli.env.adapters import adapter
from slimecli.env.provider import EnvLoadError, EnvProvider
from slimecli.rollout.data import jsonl_objects

GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class SourceSpec:
    label: str
    kind: str
    env_id: str
    args: dict[str, Any]
    ratio: float = 1.0


def mixed(m: EnvSourceConfig) -> SourceSpec:
    return SourceSpec(m.name, m.env, m.id, dict(m.args), m.ratio)


def source_specs(env: EnvConfig) -> list[SourceSpec]:
    if env.mix:
        return [mixed(m) for m in env.mix]
    if env.name in ("none", "mix") or not env.id:
        return []
    return [SourceSpec(default_label(env.id), env.name, env.id, dict(env.args))]


def default_label(env_id: str) -> str:
    """A metric-friendly label from an id: `pkg.module:Name` -> `Name`."""
    tail = env_id.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in tail) or "env"


def load_provider(spec: SourceSpec, env: EnvConfig) -> EnvProvider:
    return adapter(spec.kind).load(spec.env_id, spec.args, env)  # type: ignore[no-any-return]


def read_rows(task: TaskConfig) -> list[dict[str, Any]]:
    """task.path's rows as they are (JSONL), for environments that take dataset rows."""
    if not task.path:
        raise EnvLoadError("this environment has no tasks of its own: give its dataset rows with "
                           "task=jsonl task.path=FILE.jsonl (each row is passed to reset)")
    try:
        rows = [row for _, row in jsonl_objects(task.path)]
    except ValueError as exc:
        raise EnvLoadError(str(exc)) from None
    if not rows:
        raise EnvLoadError(f"{task.path}: no rows")
    return rows


class Source:
    """One loaded environment with its task rows."""

    def __init__(self, spec: SourceSpec, provider: EnvProvider, rows: list[dict[str, Any]]):
        self.spec, self.provider, self.rows = spec, provider, rows
        self._order: tuple[int, list[int]] | None = None

    def row(self, position: int, seed: int, shuffle: bool) -> dict[str, Any]:
        epoch, offset = divmod(position, len(self.rows))
        if self._order is None or self._order[0] != epoch:
            order = list(range(len(self.rows)))
            if shuffle:
                random.Random(f"{seed}:{self.spec.label}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self.rows[self._order[1][offset]]


def open_sources(env: EnvConfig, task: TaskConfig, split: str) -> list[Source]:
    """Load every source's environment and tasks (its own, else task.path's rows); on failure, close those
    already loaded."""
    sources: list[Source] = []
    try:
        for spec in source_specs(env):
            provider = load_provider(spec, env)
            sources.append(Source(spec, provider, []))
            own = provider.tasks(split)
            sources[-1].rows = list(own) if own else read_rows(task)
    except BaseException:
        import asyncio

        for source in sources:
            asyncio.run(source.provider.aclose())
        raise
    return sources


def pick(position: int, ratios: list[float]) -> int:
    """The source of the record at `position`: low-discrepancy over the ratios."""
    u = (position * GOLDEN + 0.5 * GOLDEN) % 1.0
    total = sum(ratios)
    acc = 0.0
    for i, ratio in enumerate(ratios):
        acc += ratio / total
        if u < acc:
            return i
    return len(ratios) - 1


def record(sources: list[Source], position: int, seed: int, shuffle: bool) -> dict[str, Any]:
    source = sources[pick(position, [s.spec.ratio for s in sources])]
    row = source.row(position, seed, shuffle)
    return {"task": row, "source": source.spec.label, "position": position, "prompt": prompt_text(row),
            "metadata": {"source": source.spec.label}}


def prompt_text(row: dict[str, Any]) -> str:
    """A short description of the row for transcripts and logs."""
    for key in ("prompt", "question", "instruction"):
        if key in row:
            value = row[key]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)[:2000]
    return json.dumps(row, ensure_ascii=False, default=str)[:2000]
