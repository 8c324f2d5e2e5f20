"""The agent rollout kind (rollout.generate=agent): each SWE task of a step is worked by n agent runs, each in
its own sandbox and graded by the task's tests. Its group runner feeds the one collect loop (rollout/collect.py),
which a group must pass with at least 2 valid runs; the result has the single-turn driver's shape.

It lives with the agent back-end rather than in slimecli.rollout because it drives agent runs (run_task); the
rollout layer below it knows nothing of agents.

A run lost to the infrastructure (no CLI, nothing captured, a crash, a sandbox that would not grade) is redone in
a fresh sandbox up to agent.max_retries times; a run the model itself ended (out of time, turns or context)
follows agent.on_timeout: mask keeps it removed from training and from its group's statistics, zero trains it
with reward 0. A group left with fewer than 2 valid runs carries no comparison and is replaced by a new task.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimecli.agent.harness.jobs import AgentJob, SweJob
from slimecli.agent.harness.task import run_task
from slimecli.agent.trajectory.archive import RunArchive
from slimecli.config.schema import SlimeConfig
from slimecli.rollout.collect import Filters, RolloutResult, Run, collect
from slimecli.rollout.data import PromptSource
from slimecli.rollout.sample import Sample

log = logging.getLogger("slimecli.rollout")

# Ends that say nothing about the model: redone in a fresh sandbox.
INFRA_REASONS = frozenset({"cli_missing", "adapter_session_empty", "missing_image_or_workdir", "unevaluatable:sandbox"})
INFRA_PREFIXES = ("exception:",)
# Ends the model caused: agent.on_timeout decides.
MODEL_REASONS = frozenset({"wall_clock_timeout", "context_limit", "turn_limit"})
MIN_VALID = 2  # runs a group needs for a group-relative advantage
FILTERS = Filters(min_valid_runs=MIN_VALID, top_up=True,  # later rounds ask only for the groups still missing
                  exhausted_hint=f"a group needs {MIN_VALID} valid agent runs: see agent/abort_rate/* in the "
                                 "metrics and the runs' abort reasons")


def abort_kind(reason: str) -> str:
    """infra (retry) | model (agent.on_timeout) | other (removed, not retried: e.g. the grading budget ran out)."""
    if reason in INFRA_REASONS or reason.startswith(INFRA_PREFIXES):
        return "infra"
    return "model" if reason in MODEL_REASONS else "other"


def abort_reason(samples: list[Sample]) -> str | None:
    return next((str(s.metadata["abort_reason"]) for s in samples if s.metadata.get("abort_reason")), None)


@dataclass
class AgentRun:
    """One (task, run slot): the samples of its last attempt and what every attempt cost."""

    samples: list[Sample]
    aborts: list[str] = field(default_factory=list)  # abort reason of each attempt that ended in one
    seconds: list[float] = field(default_factory=list)  # wall time of each attempt

    @property
    def valid(self) -> bool:
        """It enters its group's statistics: something of it is not removed."""
        return any(not s.remove_sample for s in self.samples)

    @property
    def grade(self) -> Mapping[str, Any] | None:
        reward = self.samples[0].reward if self.samples else None
        return reward if isinstance(reward, Mapping) else None


JobFactory = Callable[[Any], AgentJob]


class AgentRollout:
    """rollout.batch_size tasks x rollout.n_samples_per_prompt agent runs, agent.concurrency at a time."""

    def __init__(self, cfg: SlimeConfig, service: Any, source: PromptSource, job_factory: JobFactory | None = None,
                 archive: RunArchive | None = None):
        self.cfg = cfg
        self.service = service
        self.source = source
        self.job_factory = job_factory or self._swe_job
        self.archive = archive
        self.step = 1  # the training step the next collect() is for (the rollout pipeline sets it)
        self.on_progress: Callable[[str], None] | None = None  # live status of a collect (runs take minutes)
        self._limit = asyncio.Semaphore(max(1, cfg.agent.concurrency))
        self._next_index = 0
        self._rollout_ids = itertools.count(1)
        # the live counts of the collects in flight (several, with trainer.max_staleness > 1), for on_progress
        self._live = {"done": 0, "running": 0, "resolved": 0, "graded": 0}

    def _swe_job(self, task: Any) -> AgentJob:
        from slimecli.swe.env.resolve import resolve

        cfg = self.cfg
        return SweJob(task, environment=lambda t: resolve(t, cfg.task, cfg.sandbox), sandbox_settings=cfg.sandbox,
                      eval_budget_s=cfg.agent.eval_budget_s, partial=cfg.reward.partial)

    # ---- one run, one group ---------------------------------------------------------------------------
    async def _run(self, record: dict[str, Any], group_index: int, index: int) -> AgentRun:
        run = AgentRun(samples=[])
        for attempt in range(self.cfg.agent.max_retries + 1):
            base = Sample(prompt=record["prompt"], group_index=group_index, index=index,
                          rollout_id=next(self._rollout_ids), metadata={**record.get("metadata", {}), "attempt": attempt})
            async with self._limit:
                started = time.perf_counter()
                self._live["running"] += 1
                self._report()
                try:
                    run.samples = await run_task(self.service, self.job_factory(record["task"]), base_sample=base)
                finally:
                    self._live["running"] -= 1
                run.seconds.append(time.perf_counter() - started)
            reason = abort_reason(run.samples)
            if reason is None:
                break
            run.aborts.append(reason)
            kind = abort_kind(reason)
            if kind == "model" and self.cfg.agent.on_timeout == "zero":
                for s in run.samples:  # reward 0, and counted in the group (a placeholder still has no loss)
                    s.reward, s.remove_sample = 0.0, False
            if kind != "infra":
                break
        self._live["done"] += 1
        if run.grade is not None:
            self._live["graded"] += 1
            self._live["resolved"] += int(bool(run.grade.get("resolved")))
        self._report()
        return run

    def _report(self) -> None:
        if self.on_progress is not None:
            live = self._live
            rate = f"{live['resolved'] / live['graded']:.2f}" if live["graded"] else "-"
            self.on_progress(f"agent runs: {live['done']} done, {live['running']} running, resolved {rate}")

    async def _group(self, record: dict[str, Any], group_index: int) -> list[AgentRun]:
        n = self.cfg.rollout.n_samples_per_prompt
        indices = range(self._next_index, self._next_index + n)
        self._next_index += n
        return list(await asyncio.gather(*(self._run(record, group_index, i) for i in indices)))

    async def _runs(self, record: dict[str, Any], group_index: int, groups: dict[int, list[AgentRun]]) -> list[Run]:
        runs = groups[group_index] = await self._group(record, group_index)
        return [run.samples for run in runs]

    # ---- one rollout ------------------------------------------------------------------------------------
    async def collect(self) -> RolloutResult:
        """Pull tasks until rollout.batch_size groups have >= 2 valid runs (and pass the filters)."""
        step = self.step  # the rollout pipeline sets it before each collect (several may be in flight)
        if not self._live["running"]:  # no other collect in flight: the counts start again
            self._live = {"done": 0, "running": 0, "resolved": 0, "graded": 0}
        groups: dict[int, list[AgentRun]] = {}  # this collect's runs by group, kept or dropped: metrics, archive

        async def runs(record: dict[str, Any], group_index: int) -> list[Run]:
            return await self._runs(record, group_index, groups)

        result = await collect(self.cfg, self.source, runs, FILTERS)
        every_run = [run for _, runs_ in sorted(groups.items()) for run in runs_]
        result.metrics.update(run_metrics(every_run))
        if self.archive is not None:
            self.archive.record(step, every_run)
        return result

    # ---- as a rollout.generate kind ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.service.start()
        log.info("agent %s: adapter on %s", self.service.name, self.service.base_url)

    async def stop(self) -> None:
        await self.service.stop()

    def follow_restarts(self, recoveries: list[Any]) -> None:
        """The adapter's own engine clients (one per engine, in order) wait out an engine's restart as the trainer's
        do (train/coordinator/recovery.py), so a turn is not refused while a restarted engine waits for weights."""
        engine = self.service.engine
        for link, recovery in zip(getattr(engine, "links", [engine]), recoveries, strict=True):
            link.client.recovery = recovery


def agent_collector(cfg: SlimeConfig, tokenizer: Any, engines: list[Any], source: PromptSource, *,
                    run_dir: Path) -> AgentRollout:
    """rollout.generate=agent: the CLI's adapter on a free port, over the managed engines (weights pushed there
    reach the agent; each agent session sticks to one engine, whose prefix cache then holds its context)."""
    from slimecli.agent.api.service import AgentService

    service = AgentService(cfg, port=0, engine_urls=[e.base_url for e in engines])
    archive = RunArchive(run_dir / "agent", cfg.agent.keep_runs, decode=service.renderer.decode_all)
    return AgentRollout(cfg, service, source, archive=archive)


# ---- metrics -------------------------------------------------------------------------------------------
def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def run_metrics(runs: list[AgentRun]) -> dict[str, float]:
    """swe/* over the graded runs (one grade per run, whatever its branches), agent/* over every attempt."""
    graded = [run for run in runs if run.grade is not None]
    grades = [run.grade for run in runs if run.grade is not None]
    diffs = [str(run.samples[0].metadata.get("diff", "")) for run in graded]
    attempts = sum(len(run.seconds) for run in runs)
    out: dict[str, float] = {
        "swe/graded": float(len(graded)),
        "swe/resolved_rate": _mean([float(g.get("resolved", 0)) for g in grades]),
        "swe/f2p_frac": _mean([float(g.get("f2p", 0.0)) for g in grades]),
        "swe/p2p_frac": _mean([float(g.get("p2p", 0.0)) for g in grades]),
        "swe/patch_applied_rate": _mean([float(g.get("applied", 0)) for g in grades]),
        "swe/empty_patch_rate": _mean([float(not d.strip()) for d in diffs]),
        "swe/touched_tests": _mean([float(g.get("touched_tests", 0)) for g in grades]),
        "agent/runs": float(len(runs)),
        "agent/turns_mean": _mean([float(sum(int(s.metadata.get("turns", 0)) for s in run.samples))
                                   for run in runs if run.valid]),
        "agent/retries": float(attempts - len(runs)),
    }
    valid = [run for run in runs if run.valid]
    out["agent/ill_formed_turns"] = _mean([float(sum(int(s.metadata.get("ill_formed_turns", 0)) for s in run.samples))
                                           for run in valid])
    out["agent/branches_mean"] = _mean([float(len(run.samples)) for run in valid])
    out["agent/context_truncated_rate"] = _mean([float(any(s.metadata.get("context_truncated") for s in run.samples))
                                                 for run in valid])
    calls: dict[str, int] = {}
    for run in valid:
        for s in run.samples:
            for name, count in (s.metadata.get("tool_calls") or {}).items():
                calls[name] = calls.get(name, 0) + int(count)
    for name, count in sorted(calls.items()):  # calls per valid run
        out[f"agent/tool_calls/{name}"] = count / len(valid)
    out.update(time_split([run.samples for run in runs]))
    reasons: dict[str, int] = {}
    for run in runs:
        for reason in run.aborts:
            reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in sorted(reasons.items()):
        out[f"agent/abort_rate/{reason}"] = count / max(attempts, 1)
    seconds = [s for run in runs for s in run.seconds]
    out["agent/run_s_p50"] = percentile(seconds, 50)
    out["agent/run_s_p95"] = percentile(seconds, 95)
    return out


def time_split(runs: list[list[Sample]]) -> dict[str, float]:
    """Where a run's time went, mean seconds per run: making its sandbox, the engine (every turn's /generate),
    the CLI and its tools (the CLI's wall time less the engine's), grading."""
    parts: dict[str, list[float]] = {"sandbox": [], "engine": [], "cli": [], "grade": []}
    for samples in runs:
        if not samples:
            continue
        meta = samples[0].metadata
        engine = sum(float(s.metadata.get("engine_s", 0.0)) for s in samples)
        if "sandbox_s" in meta:
            parts["sandbox"].append(float(meta["sandbox_s"]))
        if "elapsed_s" in meta:
            parts["engine"].append(engine)
            parts["cli"].append(max(0.0, float(meta["elapsed_s"]) - engine))
        if "grade_s" in meta:
            parts["grade"].append(float(meta["grade_s"]))
    return {f"agent/time/{name}_s": _mean(values) for name, values in parts.items() if values}
