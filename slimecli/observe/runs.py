"""Reading finished (or running) runs for reports: metrics rows, resolved config, command line, and the labels
that tell several runs apart (the config keys whose values differ between them).

Nothing here imports torch or matplotlib: `slimecli report` stays light.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimecli.config.decode import finite
from slimecli.observe.metrics import METRICS_FILE, read_metrics

CONFIG_FILE = "config.yaml"
COMMAND_FILE = "command.txt"

# Keys that differ between any two runs without making them different experiments: where a run lives, the
# ports and hosts it used, how it logged. run.seed is not here: seeds are grouped (see group_runs).
IGNORED_KEYS = ("run.dir", "run.root", "run.name", "run.resume", "run.log_level")
IGNORED_PREFIXES = ("observe.", "cluster.")
IGNORED_LEAVES = ("port", "host", "url", "master_port", "log_interval_s")
SEED_KEY = "run.seed"
MAX_LABEL_KEYS = 3


class NotARun(ValueError):
    """A path that is not a run directory (no metrics.jsonl and no config.yaml)."""


@dataclass
class Run:
    path: Path
    rows: list[dict[str, Any]]
    config: dict[str, Any]  # the resolved config as plain YAML data ({} when config.yaml is missing)
    command: str  # every command line that ran in the directory (a resume appends one)
    label: str = ""

    @property
    def name(self) -> str:
        return self.path.name

    def keys(self) -> set[str]:
        return {k for row in self.rows for k, v in row.items() if finite(v) is not None}

    def series(self, key: str, x: str = "step") -> tuple[list[float], list[float]]:
        """(steps, values) of every row where ``key`` is a finite number; the step is the row's ``x`` (e.g.
        eval/weight_version: the training steps behind the weights evaluated), else its step."""
        steps, values = [], []
        for row in self.rows:
            value = finite(row.get(key))
            step = finite(row.get(x)) if x in row else finite(row.get("step"))
            if value is not None and step is not None:
                steps.append(step)
                values.append(value)
        return steps, values

    def last(self, key: str) -> float | None:
        _, values = self.series(key)
        return values[-1] if values else None

    @property
    def seed(self) -> Any:
        return flatten(self.config).get(SEED_KEY)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and ((path / METRICS_FILE).is_file() or (path / CONFIG_FILE).is_file())


def load_run(path: str | Path) -> Run:
    """The run in ``path``; NotARun when it is not a run directory."""
    p = Path(path).expanduser()
    if not p.exists():
        raise NotARun(f"{p}: no such directory")
    if not is_run_dir(p):
        raise NotARun(f"{p} is not a run directory: it has neither {METRICS_FILE} nor {CONFIG_FILE} "
                      f"(pass the directory `slimecli train` printed as its run directory)")
    by_step: dict[Any, dict[str, Any]] = {}
    for row in read_metrics(p):
        if isinstance(row, dict):
            by_step[row.get("step")] = row  # a step logged twice (a resume): the later line wins
    rows = sorted(by_step.values(), key=lambda r: finite(r.get("step")) or 0.0)
    command_path = p / COMMAND_FILE
    command = command_path.read_text(encoding="utf-8", errors="replace").strip() if command_path.is_file() else ""
    return Run(p.resolve(), rows, _read_config(p / CONFIG_FILE), command)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optimizer": {"name": "adam"}} -> {"optimizer.name": "adam"}; a list of mappings gives
    "eval.datasets[0].name" keys, as config errors name them."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                out.update(flatten(item, f"{name}[{i}]."))
        else:
            out[name] = value
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _ignored(key: str) -> bool:
    return key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES) or key.rsplit(".", 1)[-1] in IGNORED_LEAVES


def differing_keys(configs: Sequence[Mapping[str, Any]], *, include_seed: bool = False) -> list[str]:
    """Config keys whose value is not the same in every config: `.name` keys first (they name a group member,
    e.g. optimizer.name), then the rest in order."""
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f})
    out = [k for k in keys if not _ignored(k) and (include_seed or k != SEED_KEY)
           and len({_canonical(f.get(k)) for f in flat}) > 1]
    return sorted(out, key=lambda k: (not k.endswith(".name"), out.index(k)))


def _fmt(value: Any, width: int = 40) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    text = "null" if value is None else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def label_runs(runs: Sequence[Run], by: Sequence[str] | None = None) -> list[str]:
    """One label per run from the keys that differ (seeds aside): 'optimizer.name=stateless_adam'.

    The shortest that still tells every two different configs apart: the `.name` keys that differ (a group
    member's name stands for the keys it sets), else up to MAX_LABEL_KEYS keys, else all of them. ``by``: label
    with these keys only, whatever else differs (runs that agree on them are grouped). Where no key differs: the
    directory's name for a single run or for runs of one config and one seed, and the run.name for runs that
    differ by seed only (so they form one group).
    """
    flat = [flatten(r.config) for r in runs]

    def text(f: Mapping[str, Any], keys: Sequence[str]) -> str:
        return ", ".join(f"{k}={_fmt(f.get(k))}" for k in keys)

    if by:
        return [text(f, by) for f in flat]
    keys = differing_keys([r.config for r in runs])
    if not keys:
        if len(runs) == 1 or len({_canonical(r.seed) for r in runs}) == 1:
            return [r.name for r in runs]
        return [str(flat[0].get("run.name") or "run")] * len(runs)
    signatures = [text(f, keys) for f in flat]
    names = [k for k in keys if k.endswith(".name")]
    for chosen in ([names] if names else []) + [keys[:MAX_LABEL_KEYS]]:
        labels = [text(f, chosen) for f in flat]
        if all(len({sig for sig, lab in zip(signatures, labels, strict=True) if lab == label}) == 1
               for label in labels):
            more = ", ..." if chosen is not names and len(chosen) < len(keys) else ""
            return [label + more for label in labels]
    return signatures


@dataclass
class Group:
    """Runs with the same label: one line, or seeds of one setting (a mean with a ± std band)."""

    label: str
    runs: list[Run] = field(default_factory=list)

    @property
    def display(self) -> str:
        n = len(self.runs)
        return self.label if n == 1 else f"{self.label} ({n} runs)"

    def series(self, key: str, x: str = "step") -> tuple[list[float], list[float], list[float]]:
        """(steps, mean, spread): one run gives its values (spread 0); several give, at every step, the mean over
        the runs that have it and the standard deviation across them."""
        if len(self.runs) == 1:
            steps, values = self.runs[0].series(key, x)
            return steps, values, [0.0] * len(values)
        at: dict[float, list[float]] = {}
        for run in self.runs:
            for s, v in zip(*run.series(key, x), strict=True):
                at.setdefault(s, []).append(v)
        steps = sorted(at)
        means = [sum(at[s]) / len(at[s]) for s in steps]
        stds = [_std(at[s]) for s in steps]
        return steps, means, stds


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def group_runs(runs: Sequence[Run], *, seeds: str = "band", by: Sequence[str] | None = None) -> list[Group]:
    """Runs labelled (label_runs) and grouped: with seeds="band" runs whose label is the same (they differ by
    run.seed only, or agree on the ``by`` keys) form one group; with seeds="lines" every run is its own group,
    labelled with its seed."""
    labels = label_runs(runs, by)
    groups: dict[str, Group] = {}
    for run, label in zip(runs, labels, strict=True):
        if seeds == "lines" and sum(lab == label for lab in labels) > 1:
            label = f"{label}, seed={_fmt(run.seed)}"
        run.label = label
        groups.setdefault(label, Group(label)).runs.append(run)
    return list(groups.values())


def summary(runs: Iterable[Run], *, key: str = "reward/mean", threshold: float = 0.8) -> dict[str, Any]:
    """Numbers that compare runs: the final reward (mean over the last 10% of steps, at least one), the first
    step whose reward reaches ``threshold`` (None unless every run reaches it), the median step time, and the
    held-out reward of the first and the last evaluation (the first eval/<name>/reward_mean); means over the
    runs given (seeds)."""
    runs = list(runs)
    finals, reached, step_times, steps, eval_start, eval_end = [], [], [], [], [], []
    eval_keys = sorted({k for r in runs for k in r.keys() if k.startswith("eval/") and k.endswith("/reward_mean")})
    for run in runs:
        s, values = run.series(key)
        if values:
            tail = max(1, len(values) // 10)
            finals.append(sum(values[-tail:]) / tail)
            reached.append(next((st for st, v in zip(s, values, strict=True) if v >= threshold), None))
        _, times = run.series("time/step_s")
        if times:
            step_times.append(sorted(times)[len(times) // 2])
        if run.rows:
            steps.append(float(sum(1 for row in run.rows if finite(row.get("step")) not in (None, 0.0))))
        if eval_keys:
            _, evals = run.series(eval_keys[0], x="eval/weight_version")
            if evals:
                eval_start.append(evals[0])
                eval_end.append(evals[-1])

    def mean(xs: Sequence[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    hits = [h for h in reached if h is not None]
    return {"steps": mean(steps), "final_reward": mean(finals),
            "steps_to_threshold": mean(hits) if hits and len(hits) == len(reached) else None,
            "reached_threshold": len(hits), "runs": len(reached), "step_time_s": mean(step_times),
            "eval_key": eval_keys[0] if eval_keys else None, "eval_start": mean(eval_start),
            "eval_end": mean(eval_end)}
