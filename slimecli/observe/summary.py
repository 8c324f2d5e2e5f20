"""The block `slimecli train` prints when a run ends: what the run achieved and where its results are.

A pure function of the run directory (metrics.jsonl, eval/step_<N>/summary.json, checkpoints/, final/,
report/), so that it reads the same for a run that just ended, a resumed one, or one looked at later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimecli.config.decode import finite
from slimecli.config.groups.sandbox import LOCAL_GAPS
from slimecli.observe.report import HTML_FILE, REPORT_DIR
from slimecli.observe.runs import load_run

REWARD_KEY = "reward/mean"
# The step's stage times: time/<stage>_s; these two are sums of stages, not stages of their own.
STAGE_TOTALS = ("time/step_s", "time/train_s")
# Written by slimecli.eval.runner (not imported: it pulls in the rollout driver): RUN/eval/step_<N>/summary.json.
EVAL_DIR, EVAL_SUMMARY = "eval", "summary.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class EvalChange:
    """One eval dataset's reward_mean on the first and on the last evaluated weights."""

    name: str
    before: float
    before_step: int
    after: float
    after_step: int


@dataclass
class RunSummary:
    run_dir: Path
    steps: int = 0  # the last step logged
    max_steps: int | None = None  # trainer.max_steps of config.yaml
    final_reward: float | None = None
    best_reward: float | None = None
    best_step: int | None = None
    evals: list[EvalChange] = field(default_factory=list)
    wall_s: float | None = None  # the run's: every command's that trained it, this one's included
    command_s: float | None = None  # this command's own clock (None: the summary of a run looked at later)
    stage_share: dict[str, float] = field(default_factory=dict)  # stage -> fraction of the summed stage times
    final_dir: Path | None = None
    merged_dir: Path | None = None  # a LoRA run: final/ is the adapter, final-merged/ the model it makes
    report: Path | None = None
    last_checkpoint: Path | None = None
    replayed: str | None = None  # rollout.replay: the dump it trained on (nothing to resume or continue)
    unisolated: bool = False  # the run's agent commands ran under sandbox=local

    @property
    def finished(self) -> bool:
        return self.max_steps is not None and self.steps >= self.max_steps

    def more_steps(self) -> list[str]:
        """What a finished run's command adds to train on (a run that stopped early resumes as it was)."""
        return [f"trainer.max_steps={self.max_steps * 2}"] if self.finished and self.max_steps else []


def summarize(run_dir: str | Path, command_s: float | None = None, command_start: float | None = None) -> RunSummary:
    """The summary of the run in ``run_dir``. ``command_s``: the seconds of the command that just trained it, which
    started at ``command_start`` (time.time()); the run's wall time is then the earlier commands' (their steps, from
    the metrics) plus this one's. Without them, the run's from its metrics alone."""
    run = load_run(run_dir)
    out = RunSummary(run.path)
    trainer = run.config.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("max_steps"), int):
        out.max_steps = trainer["max_steps"]
    rollout = run.config.get("rollout")
    if isinstance(rollout, dict) and rollout.get("replay"):
        out.replayed = str(rollout["replay"])
    rewards = [(int(row["step"]), value) for row in run.rows if isinstance(row.get("step"), int)
               and (value := finite(row.get(REWARD_KEY))) is not None]
    out.steps = max((row["step"] for row in run.rows if isinstance(row.get("step"), int)), default=0)
    if rewards:
        out.final_reward = rewards[-1][1]
        out.best_step, out.best_reward = max(rewards, key=lambda sr: (sr[1], -sr[0]))
    if command_s is None:
        out.wall_s = _steps_wall_s(run.rows)
    else:
        earlier = [row for row in run.rows if command_start is not None
                   and (t := finite(row.get("time"))) is not None and t < command_start]
        out.command_s = command_s
        out.wall_s = (_steps_wall_s(earlier) or 0.0) + command_s
    out.stage_share = _stage_share(run.rows)
    out.evals = _eval_changes(run.path)
    final, merged = run.path / "final", run.path / "final-merged"
    out.final_dir = final if final.is_dir() else None
    out.merged_dir = merged if merged.is_dir() else None
    report = run.path / REPORT_DIR / HTML_FILE
    out.report = report if report.is_file() else None
    out.last_checkpoint = _last_step_dir(run.path / "checkpoints")
    out.unisolated = _unisolated(run.config)
    return out


def _unisolated(config: dict[str, Any]) -> bool:
    """sandbox=local in a run that runs model-written code (an agent, SWE tasks or SWE eval datasets)."""
    def get(group: str, key: str) -> Any:
        value = config.get(group)
        return value.get(key) if isinstance(value, dict) else None

    datasets = get("eval", "datasets")
    swe_eval = isinstance(datasets, list) and any(isinstance(d, dict) and d.get("task") == "swe" for d in datasets)
    agent = get("agent", "name") not in (None, "none")
    return get("sandbox", "name") == "local" and (get("task", "name") == "swe" or agent or swe_eval
                                                  or get("rollout", "generate") == "agent")


def _steps_wall_s(rows: list[dict[str, Any]]) -> float | None:
    """The time the logged steps cover: each step runs from its row's time less its time/step_s to its row's time,
    one after the other, so that the gap between a run that stopped and its resume is not counted."""
    spans = sorted((t - max(finite(row.get("time/step_s")) or 0.0, 0.0), t) for row in rows
                   if (t := finite(row.get("time"))) is not None)
    if not spans:
        return None
    total, reached = 0.0, float("-inf")
    for start, end in spans:
        total += max(end - max(start, reached), 0.0)
        reached = max(reached, end)
    return total


def _stage_share(rows: list[dict[str, Any]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            seconds = finite(value)
            if key.startswith("time/") and key.endswith("_s") and key not in STAGE_TOTALS and seconds is not None:
                name = key[len("time/"):-len("_s")]
                totals[name] = totals.get(name, 0.0) + max(seconds, 0.0)
    whole = sum(totals.values())
    if whole <= 0:
        return {}
    return {name: s / whole for name, s in sorted(totals.items(), key=lambda kv: -kv[1]) if s > 0}


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def _last_step_dir(root: Path) -> Path | None:
    dirs = _step_dirs(root)
    return dirs[-1][1] if dirs else None


def _eval_changes(run_dir: Path) -> list[EvalChange]:
    """Per dataset: reward_mean of its first and last successful evaluation."""
    seen: dict[str, list[tuple[int, float]]] = {}
    for step, path in _step_dirs(run_dir / EVAL_DIR):
        try:
            data = json.loads((path / EVAL_SUMMARY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for ds in data.get("datasets", []) if isinstance(data, dict) else []:
            if not isinstance(ds, dict) or ds.get("error") or not isinstance(ds.get("metrics"), dict):
                continue
            value = finite(ds["metrics"].get("reward_mean"))
            if value is not None and isinstance(ds.get("name"), str):
                seen.setdefault(ds["name"], []).append((step, value))
    return [EvalChange(name, points[0][1], points[0][0], points[-1][1], points[-1][0])
            for name, points in seen.items()]


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def render(summary: RunSummary, command: str | None = None) -> list[str]:
    """The block's lines, plain text (the caller styles or prefixes them). ``command``: the one that resumes or
    continues the run with its own overrides (launch.rundir.resume_command); else the bare run.dir one."""
    lines = [f"run summary ({summary.steps} step{'s' if summary.steps != 1 else ''}"
             + (f" of {summary.max_steps}" if summary.max_steps is not None else "") + ")"]
    if summary.final_reward is not None and summary.best_reward is not None:
        lines.append(f"  reward       final {summary.final_reward:.3f}, best {summary.best_reward:.3f} "
                     f"(step {summary.best_step})")
    else:
        lines.append("  reward       none logged")
    for change in summary.evals:
        if change.before_step == change.after_step:
            lines.append(f"  eval         {change.name} {change.after:.3f} (step {change.after_step})")
        else:
            lines.append(f"  eval         {change.name} {change.before:.3f} -> {change.after:.3f} "
                         f"(step {change.before_step} -> {change.after_step})")
    if summary.wall_s is not None:
        shares = ", ".join(f"{name} {share:.0%}" for name, share in summary.stage_share.items())
        took = _duration(summary.wall_s) if summary.command_s is None else \
            f"this command: {_duration(summary.command_s)}; the run: {_duration(summary.wall_s)}"
        lines.append(f"  wall time    {took}" + (f" ({shares})" if shares else ""))
    if summary.final_dir is not None:
        lines.append(f"  final model  {summary.final_dir}" + (" (the LoRA adapter)" if summary.merged_dir else ""))
        if summary.merged_dir is not None:
            lines.append(f"  merged model {summary.merged_dir}")
    elif summary.last_checkpoint is not None:
        lines.append(f"  checkpoint   {summary.last_checkpoint}")
    if summary.report is not None:
        lines.append(f"  report       {summary.report}")
    if summary.unisolated:
        lines.append(f"  sandbox      local, not isolated: {LOCAL_GAPS}")
    if summary.replayed is not None:
        lines.append(f"  replayed     the rollout dump of {summary.replayed} (no engine: nothing to continue)")
        return lines
    verb = "continue" if summary.finished else "resume"
    command = command or " ".join(["slimecli", "train", *summary.more_steps(), f"run.dir={summary.run_dir}"])
    lines.append(f"  {verb:<12} {command}")
    return lines
