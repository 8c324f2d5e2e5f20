"""The evaluator: every dataset of eval.datasets sampled on the engines (whatever weights they serve now),
scored with its reward, summarised (eval/<name>/...) and written sample by sample.

Single-turn datasets go through the rollout driver with the dataset's sampling settings; SWE datasets are
worked by the agent (its own adapter in front of the same engines) and graded by their tests, so their
reward is the grade (resolved by default). Environment datasets (`env`) are the environment's episodes on its
"eval" split, run by the environment rollout, and their reward is the episode's. A dataset that fails (a missing file, an engine error) is reported
as failed (eval/<name>/failed = 1) and does not stop the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from slimecli.config.eval_settings import dataset_env, dataset_reward, dataset_sampling, dataset_task
from slimecli.config.groups.eval import EvalDatasetConfig
from slimecli.config.schema import SlimeConfig
from slimecli.eval.datasets import load_records
from slimecli.eval.scoring import Outcome, dataset_metrics, episode_summary, sample_row
from slimecli.rollout.driver import RolloutDriver

log = logging.getLogger("slimecli.eval")

EVAL_DIR = "eval"
SUMMARY_FILE = "summary.json"


@dataclass
class DatasetResult:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)  # reward_mean, pass@k, ... (no prefix)
    seconds: float = 0.0
    error: str | None = None  # why the dataset could not be evaluated
    path: str | None = None  # its per-sample file


def flat_metrics(results: list[DatasetResult]) -> dict[str, float]:
    """eval/<name>/<metric> for the metrics rows; a failed dataset is eval/<name>/failed = 1."""
    out: dict[str, float] = {}
    for r in results:
        out.update({f"eval/{r.name}/{k}": v for k, v in r.metrics.items()})
        out[f"eval/{r.name}/failed"] = 1.0 if r.error else 0.0
    return out


def headline(results: list[DatasetResult]) -> str:
    """'eval heldout 0.812 (pass@1 0.62)' for the progress line."""
    parts = []
    for r in results:
        if r.error:
            parts.append(f"eval {r.name} failed")
        elif "reward_mean" in r.metrics:
            p1 = r.metrics.get("pass@1")
            parts.append(f"eval {r.name} {r.metrics['reward_mean']:.3f}" + (f" (pass@1 {p1:.2f})" if p1 is not None else ""))
    return " | ".join(parts)


class _Driver(RolloutDriver):
    """The rollout driver with the dataset's stop strings; its samples' seeds named by the dataset and the record,
    the same at every evaluation (the steps' results differ by the weights, not by the draw; a resumed run
    evaluates as the uninterrupted one)."""

    def __init__(self, cfg: SlimeConfig, tokenizer: Any, engines: list[Any], stop: tuple[str, ...] | None,
                 scope: tuple[Any, ...] = (), encoded: dict[int, list[int]] | None = None):
        super().__init__(cfg, tokenizer, engines, cast(Any, None))
        self.stop = list(stop or ())
        self.scope = scope
        self.encoded = {} if encoded is None else encoded  # record index -> prompt ids, kept across evaluations

    def prompt_ids(self, record: dict[str, Any], group_index: int) -> list[int]:
        if group_index not in self.encoded:
            self.encoded[group_index] = super().prompt_ids(record, group_index)
        return self.encoded[group_index]

    def group_key(self, record: dict[str, Any], group_index: int) -> tuple[Any, ...] | None:
        return ("eval", *self.scope, group_index)

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        params = super().sampling_params(max_new_tokens)
        if self.stop:
            params["stop"] = self.stop
        return params


class Evaluator:
    """Evaluates cfg.eval.datasets against `engines` (EngineClient-like) and writes RUN/eval/step_<N>/."""

    def __init__(self, cfg: SlimeConfig, tokenizer: Any, engines: list[Any], run_dir: str | Path):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.engines = engines
        self.run_dir = Path(run_dir)
        self._records: dict[str, list[dict[str, Any]]] = {}  # each dataset is read once
        self._encoded: dict[str, dict[int, list[int]]] = {}  # and its prompts encoded once
        self.job_factory: Any = None  # SWE datasets: how a task becomes an agent job (None: graded by its tests)

    def due(self, step: int, max_steps: int) -> bool:
        """After training step `step` (0: before the first): at_start, every interval steps, at_end."""
        e = self.cfg.eval
        if not e.datasets:
            return False
        if step == 0:
            return e.at_start
        return (e.interval > 0 and step % e.interval == 0) or (e.at_end and step == max_steps)

    async def evaluate(self, step: int) -> list[DatasetResult]:
        out_dir = self.run_dir / EVAL_DIR / f"step_{step}"
        out_dir.mkdir(parents=True, exist_ok=True)
        results = []
        for ds in self.cfg.eval.datasets:
            started = time.perf_counter()
            result = DatasetResult(ds.name)
            try:
                outcomes = await self._outcomes(ds)
                n = dataset_sampling(ds, self.cfg.rollout).n_samples_per_prompt
                result.metrics = dataset_metrics(outcomes, n, ds.pass_threshold, swe=ds.task == "swe")
                if ds.env is not None:
                    result.metrics.update(episode_summary(outcomes, ds.name))
                path = out_dir / f"{ds.name}.jsonl"
                with open(path, "w", encoding="utf-8") as f:
                    for o in outcomes:
                        f.write(json.dumps(sample_row(o, ds.pass_threshold), allow_nan=False) + "\n")
                result.path = str(path)
            except Exception as exc:  # one dataset failing is a result, the others still run
                log.warning("eval %s failed", ds.name, exc_info=True)
                result.error = f"{type(exc).__name__}: {exc}"
            result.seconds = time.perf_counter() - started
            results.append(result)
        self._write_summary(out_dir, step, results)
        return results

    def _write_summary(self, out_dir: Path, step: int, results: list[DatasetResult]) -> None:
        data = {"step": step, "datasets": [{"name": r.name, "metrics": r.metrics, "seconds": round(r.seconds, 3),
                                            "error": r.error, "path": r.path} for r in results]}
        (out_dir / SUMMARY_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    def records(self, ds: EvalDatasetConfig) -> list[dict[str, Any]]:
        if ds.name not in self._records:
            self._records[ds.name] = load_records(ds)
        return self._records[ds.name]

    def scoped(self, ds: EvalDatasetConfig) -> SlimeConfig:
        """The run's config as this dataset sees it: its sampling, its task source, its reward."""
        return replace(self.cfg, rollout=dataset_sampling(ds, self.cfg.rollout), task=dataset_task(ds, self.cfg.task),
                       reward=dataset_reward(ds, self.cfg.reward))

    async def _outcomes(self, ds: EvalDatasetConfig) -> list[Outcome]:
        from slimecli.reward import Invalid, assign_rewards, sample_reward

        cfg = self.scoped(ds)
        if ds.env is not None:  # the episode's reward is the reward
            return await self._env_outcomes(ds, cfg)
        records = self.records(ds)
        if ds.task == "swe":
            outcomes = await self._agent_outcomes(cfg, records)
        else:
            driver = _Driver(cfg, self.tokenizer, self.engines, ds.stop, (ds.name,), self._encoded.setdefault(ds.name, {}))
            groups = await driver.groups(records)
            outcomes = [Outcome(i, j, records[i], [s], None) for i, group in enumerate(groups)
                        for j, s in enumerate(group)]
        flat = [s for o in outcomes for s in o.samples]
        await assign_rewards(flat, cfg.reward, log)
        for o in outcomes:
            if o.invalid is not None or not o.samples:
                o.invalid = o.invalid or "no sample"
                continue
            value = sample_reward(o.samples[0], cfg.reward.key)
            if isinstance(value, Invalid):
                o.invalid = str(value)
            else:
                o.value = float(value)
        return outcomes

    async def _env_outcomes(self, ds: EvalDatasetConfig, cfg: SlimeConfig) -> list[Outcome]:
        """n episodes of each of the environment's eval tasks (the first max_samples), run by the environment
        rollout with the run's env budgets; a dropped episode is invalid, with its reason."""
        from slimecli.env.rollout import EnvRollout
        from slimecli.env.sources import open_sources, record

        cfg = replace(cfg, env=dataset_env(ds, self.cfg.env))
        sources = await asyncio.to_thread(open_sources, cfg.env, cfg.task, cfg.env.split)  # loading may block
        rollout = EnvRollout(cfg, self.tokenizer, self.engines, cast(Any, None), sources=sources)
        rollout.seed_scope = ("eval", ds.name)  # the same draw at every evaluation, none of training's
        try:
            rows = len(sources[0].rows)
            records = [record(sources, i, cfg.run.seed, False) for i in range(min(rows, ds.max_samples or rows))]
            groups = await asyncio.gather(*(rollout.group(rec, i) for i, rec in enumerate(records)))
        finally:
            await rollout.stop()
        outcomes = []
        for i, runs in enumerate(groups):
            for j, (s,) in enumerate(runs):
                dropped = s.metadata.get("drop_reason", "aborted") if s.remove_sample else None
                outcomes.append(Outcome(i, j, records[i], [s], None if dropped else float(s.reward),
                                        f"dropped: {dropped}" if dropped else None))
        return outcomes

    async def _agent_outcomes(self, cfg: SlimeConfig, records: list[dict[str, Any]]) -> list[Outcome]:
        """n agent runs of every task, through an adapter of their own in front of the engines."""
        from slimecli.agent.api.service import AgentService
        from slimecli.agent.training.collector import AgentRollout, abort_reason

        service = AgentService(cfg, port=0, engine_urls=[e.base_url for e in self.engines])
        await service.start()
        try:
            rollout = AgentRollout(cfg, service, cast(Any, None), job_factory=self.job_factory)
            groups = await asyncio.gather(*(rollout._group(rec, i) for i, rec in enumerate(records)))
        finally:
            await service.stop()
        outcomes = []
        for i, runs in enumerate(groups):
            for j, run in enumerate(runs):
                why = None if run.valid else (abort_reason(run.samples) or "aborted")
                outcomes.append(Outcome(i, j, records[i], list(run.samples), None, why))
        return outcomes


def read_summary(run_dir: str | Path, step: int) -> dict[str, Any] | None:
    path = Path(run_dir) / EVAL_DIR / f"step_{step}" / SUMMARY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
