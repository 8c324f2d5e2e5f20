"""The environment rollout kind (rollout.generate=env, implied by env=...): each task of a step is the start of
rollout.n_samples_per_prompt episodes, env.concurrency at a time, each sticking to one engine (whose prefix cache
then holds its history). The episodes feed the one collect loop (rollout/collect.py); a dropped episode is a
removed sample, and a group left with fewer than 2 episodes that can train is replaced by a new task.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from slimecli.config.schema import SlimeConfig
from slimecli.env.episode import EpisodeRunner
from slimecli.env.sources import Source, open_sources, record
from slimecli.model.tool_calls import get_parser
from slimecli.rollout.collect import Filters, RolloutResult, Run, collect
from slimecli.rollout.data import PromptSource
from slimecli.rollout.driver import sample_seed
from slimecli.rollout.sample import Sample

log = logging.getLogger("slimecli.rollout")


def stop_ids(tokenizer: Any) -> frozenset[int]:
    """The ids that end a turn: EOS and the chat template's end-of-turn markers."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return frozenset(ids)


class EnvRollout:
    def __init__(self, cfg: SlimeConfig, tokenizer: Any, engines: list[Any], source: PromptSource,
                 split: str | None = None, sources: list[Source] | None = None) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.engines = engines
        self.position = source  # the run's resumable position in the task stream (checkpointed)
        self.sources = sources if sources is not None else open_sources(cfg.env, cfg.task, split or cfg.env.split)
        e = cfg.env
        self.runner = EpisodeRunner(e, tokenizer, get_parser(e.tool_parser), stop_ids(tokenizer),
                                    e.max_tokens_per_turn or cfg.rollout.max_new_tokens)
        self._limit = asyncio.Semaphore(max(1, e.concurrency))
        self._engine_cycle = itertools.cycle(range(len(engines)))
        self._next_index = 0
        self.min_valid = min(2, cfg.rollout.n_samples_per_prompt)
        self.seed_scope: tuple[Any, ...] = ("env",)  # names the episodes' sampling seeds (the evaluator: its dataset)

    # ---- one episode, one group -------------------------------------------------------------------------
    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": max_new_tokens,
                "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False}

    async def episode(self, rec: dict[str, Any], group_index: int, index: int, slot: int = 0) -> Sample:
        """One episode of task ``rec``; ``slot``: its place in its group, which names its sampling seeds."""
        engine = self.engines[next(self._engine_cycle)]
        source = next(s for s in self.sources if s.spec.label == rec["source"])
        position = rec.get("position")

        async def generate(ids: list[int], max_new_tokens: int, turn: int, extra: dict[str, Any]) -> dict[str, Any]:
            params = {**self.sampling_params(max_new_tokens), **extra}
            if position is not None:
                params["sampling_seed"] = sample_seed(self.cfg.run.seed, *self.seed_scope, position, slot, turn)
            out = await engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
            return out if isinstance(out, dict) else out[0]

        sample = Sample(prompt=rec["prompt"], group_index=group_index, index=index,
                        metadata={**rec.get("metadata", {}), "source": rec["source"]})
        async with self._limit:
            env = source.provider.episode()
            return await self.runner.run(env, rec["task"], generate, sample)

    async def group(self, rec: dict[str, Any], group_index: int, episodes: list[Sample] | None = None) -> list[Run]:
        """n_samples_per_prompt episodes of task ``rec``, each a run of its own (``episodes``: where every one of
        them is noted, kept or not)."""
        n = self.cfg.rollout.n_samples_per_prompt
        first = self._next_index
        self._next_index += n
        samples = await asyncio.gather(*(self.episode(rec, group_index, first + j, j) for j in range(n)))
        if episodes is not None:
            episodes.extend(samples)
        return [[s] for s in samples]

    # ---- one rollout --------------------------------------------------------------------------------------
    async def collect(self) -> RolloutResult:
        """Pull tasks until rollout.batch_size groups have >= 2 episodes that train (and pass the filters)."""
        episodes: list[Sample] = []  # every episode of this collect, kept or not: the per-source metrics
        stream = _Stream(self.position, self.sources, self.cfg)
        filters = Filters(min_valid_runs=self.min_valid, exhausted_hint="episodes are dropped: see "
                          "env/<source>/dropped/* in the metrics and the samples' drop_detail")

        async def runs(rec: dict[str, Any], group_index: int) -> list[Run]:
            return await self.group(rec, group_index, episodes)

        result = await collect(self.cfg, stream, runs, filters)  # type: ignore[arg-type]
        result.metrics.update(episode_metrics(episodes))
        return result

    async def stop(self) -> None:
        await asyncio.gather(*(s.provider.aclose() for s in self.sources), return_exceptions=True)


class _Stream:
    """The collect loop's prompt source: records of the environments' tasks at the run's position."""

    def __init__(self, position: PromptSource, sources: list[Source], cfg: SlimeConfig) -> None:
        self.position, self.sources, self.cfg = position, sources, cfg

    def next(self, n: int) -> list[dict[str, Any]]:
        return [record(self.sources, p, self.cfg.run.seed, self.cfg.task.shuffle) for p in self.position.take(n)]


def episode_metrics(episodes: list[Sample]) -> dict[str, float]:
    """env/<source>/... over every episode of the collect: reward and size of those that train, drops by reason."""
    out: dict[str, float] = {}
    by_source: dict[str, list[Sample]] = {}
    for s in episodes:
        by_source.setdefault(str(s.metadata.get("source", "env")), []).append(s)
    env_s = engine_s = prompt = cached = 0.0
    for label, samples in sorted(by_source.items()):
        kept = [s for s in samples if not s.remove_sample]
        p = f"env/{label}"
        out[f"{p}/episodes"] = float(len(samples))
        out[f"{p}/reward"] = _mean([float(s.reward) for s in kept])
        out[f"{p}/turns"] = _mean([float(s.metadata.get("turns", 0)) for s in kept])
        out[f"{p}/tokens"] = _mean([float(s.response_length) for s in kept])
        out[f"{p}/tool_errors"] = _mean([float(s.metadata.get("tool_errors", 0)) for s in kept])
        out[f"{p}/turn_limit_rate"] = _mean([float(bool(s.metadata.get("turn_limit"))) for s in kept])
        calls: dict[str, int] = {}
        for s in kept:
            for name, count in (s.metadata.get("tool_calls") or {}).items():
                calls[name] = calls.get(name, 0) + int(count)
        for name, count in sorted(calls.items()):
            out[f"{p}/tool_calls/{name}"] = count / max(len(kept), 1)
        reasons: dict[str, int] = {}
        for s in samples:
            if s.remove_sample:
                reason = str(s.metadata.get("drop_reason", "unknown"))
                reasons[reason] = reasons.get(reason, 0) + 1
        out[f"{p}/dropped"] = float(sum(reasons.values()))
        for reason, count in sorted(reasons.items()):
            out[f"{p}/dropped/{reason}"] = float(count)
    for s in episodes:
        env_s += float(s.metadata.get("env_s", 0.0))
        engine_s += float(s.metadata.get("engine_s", 0.0))
        prompt += float(s.metadata.get("prompt_tokens", 0))
        cached += float(s.metadata.get("cached_tokens", 0))
    out["env/env_s"] = env_s
    out["env/engine_s"] = engine_s
    out["env/prefix_cache_hit_rate"] = cached / prompt if prompt else 0.0
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def env_collector(cfg: SlimeConfig, tokenizer: Any, engines: list[Any], source: PromptSource) -> EnvRollout:
    """rollout.generate=env."""
    return EnvRollout(cfg, tokenizer, engines, source)
