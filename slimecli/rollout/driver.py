"""The single-turn rollout kind (rollout.generate=single_turn): each prompt's group sampled from the engines, fed
to the one collect loop (collect.py) for rewards and filters.

Every sample is drawn with a sampling_seed of its own, a hash of (run.seed, the prompt's position in the run's
prompt stream, the sample's index in its group): the engines' own RNG restarts with them, so without it a resumed
run would draw other tokens than the uninterrupted one. One seed per sample, not one per request with
sampling_params.n, because SGLang copies a request's sampling_params to its n copies (one seed would give n
equal samples).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from typing import Any

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.collect import RolloutResult, Run, collect
from slimecli.rollout.data import PromptSource
from slimecli.rollout.sample import Sample, Status, token_versions

MAX_COPIES = 64  # samples of one prompt asked for in one request (sampling_params.n); more go in several


class RolloutDriver:
    def __init__(self, cfg: SlimeConfig, tokenizer: Any, engines: list[Any], source: PromptSource):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.engines = engines
        self.source = source
        self._engine_cycle = itertools.cycle(range(len(engines)))
        self._next_index = 0
        # requests in flight, each for up to MAX_COPIES sequences: about max_running_requests sequences per engine
        copies = min(cfg.rollout.n_samples_per_prompt, MAX_COPIES)
        self._limit = asyncio.Semaphore(max(1, cfg.rollout.max_running_requests * len(engines) // copies))

    # ---- prompts --------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[dict[str, Any]]) -> list[int]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if self.cfg.task.apply_chat_template and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = self.tokenizer.encode(prompt if isinstance(prompt, str) else messages[-1]["content"])
        limit = self.cfg.rollout.max_prompt_len
        return list(ids[-limit:]) if len(ids) > limit else list(ids)

    def prompt_ids(self, record: dict[str, Any], group_index: int) -> list[int]:
        return self.encode_prompt(record["prompt"])

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": max_new_tokens,
                "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False}

    # ---- generation -----------------------------------------------------------------------
    def group_key(self, record: dict[str, Any], group_index: int) -> tuple[Any, ...] | None:
        """What names this group's prompt in the run, for its samples' seeds (None: unseeded): its position in
        the prompt stream, which a resume restores."""
        position = record.get("position")
        return None if position is None else ("rollout", position)

    async def _generate(self, copies: list[Sample], key: tuple[Any, ...] | None = None, first: int = 0) -> None:
        """Samples of one prompt from one request, so the HTTP round trips are one per group, not one per sample
        (they cost the trainer's rank 0 CPU that an overlapped training step needs): a batch of the prompt with a
        seed per sample (`key`: the group's, `first`: the index of copies[0] in the group), or unseeded
        SGLang's sampling_params.n."""
        seeds = None if key is None else [sample_seed(self.cfg.run.seed, *key, first + j) for j in range(len(copies))]
        await self._request(copies, seeds)

    async def _request(self, samples: list[Sample], seeds: list[int] | None) -> None:
        """One /generate request for ``samples``: a batch with a seed each (any prompts), or, unseeded, copies of one
        prompt as sampling_params.n. A sample with no token budget left is truncated without asking."""
        budget = self.cfg.rollout.max_new_tokens - samples[0].response_length
        if budget <= 0:
            for sample in samples:
                sample.status = Status.TRUNCATED
            return
        engine = self.engines[next(self._engine_cycle)]
        params = self.sampling_params(budget)
        prompt: list[int] | list[list[int]] = list(samples[0].tokens)
        sampling: dict[str, Any] | list[dict[str, Any]] = params
        if seeds is not None:
            prompt = [list(sample.tokens) for sample in samples]
            sampling = [{**params, "sampling_seed": seed} for seed in seeds]
        elif len(samples) > 1:
            params["n"] = len(samples)
        async with self._limit:
            out = await engine.generate(input_ids=prompt, sampling_params=sampling, return_logprob=True)
        replies = out if isinstance(out, list) else [out]
        if len(replies) != len(samples):
            raise RuntimeError(f"engine {engine.base_url} answered {len(replies)} samples for {len(samples)}")
        for sample, reply in zip(samples, replies, strict=True):
            record_reply(sample, reply)

    def new_group(self, record: dict[str, Any], group_index: int) -> list[Sample]:
        """The record's rollout.n_samples_per_prompt samples, their prompt encoded, nothing generated yet."""
        prompt_ids = self.prompt_ids(record, group_index)
        group = []
        for _ in range(self.cfg.rollout.n_samples_per_prompt):
            group.append(Sample(prompt=record["prompt"], label=record.get("label"), group_index=group_index,
                                index=self._next_index, tokens=list(prompt_ids),
                                metadata=dict(record.get("metadata") or {})))
            self._next_index += 1
        return group

    async def _group(self, record: dict[str, Any], group_index: int) -> list[Sample]:
        group = self.new_group(record, group_index)
        n, key = len(group), self.group_key(record, group_index)
        await asyncio.gather(*(self._generate(group[i:i + MAX_COPIES], key, i) for i in range(0, n, MAX_COPIES)))
        return group

    async def groups(self, records: list[dict[str, Any]]) -> list[list[Sample]]:
        """Every record's group (record i: group i), seeded, in as few requests as the engines take at once: a
        request per engine, of at most rollout.max_running_requests samples. For a caller that waits for all of
        them (an evaluation): the engine prefills the prompts together, and the HTTP round trips are a few per
        evaluation, not one per prompt."""
        groups = [self.new_group(record, i) for i, record in enumerate(records)]
        keys = [self.group_key(record, i) for i, record in enumerate(records)]
        if any(key is None for key in keys):  # unseeded: a request per group, its copies as sampling_params.n
            await asyncio.gather(*(self._generate(group[i:i + MAX_COPIES]) for group in groups
                                   for i in range(0, len(group), MAX_COPIES)))
            return groups
        work = [(sample, sample_seed(self.cfg.run.seed, *key, j))
                for group, key in zip(groups, keys, strict=True) if key is not None for j, sample in enumerate(group)]
        size = min(self.cfg.rollout.max_running_requests, -(-len(work) // len(self.engines)))
        chunks = [work[i:i + size] for i in range(0, len(work), size)]
        await asyncio.gather(*(self._request([s for s, _ in chunk], [seed for _, seed in chunk]) for chunk in chunks))
        return groups

    async def _runs(self, record: dict[str, Any], group_index: int) -> list[Run]:
        return [[sample] for sample in await self._group(record, group_index)]  # each sample is a run of its own

    # ---- one rollout ----------------------------------------------------------------------
    async def collect(self) -> RolloutResult:
        """Pull groups until `rollout.batch_size` of them pass the filters; extras are discarded."""
        return await collect(self.cfg, self.source, self._runs)


def sample_seed(run_seed: int, *key: Any) -> int:
    """The sampling_seed of one sample: a hash of the run's seed and what names the sample in the run (stable
    across processes, unlike hash()); 63 bits, as SGLang takes a signed 64-bit seed."""
    digest = hashlib.blake2b(repr((run_seed, *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def record_reply(sample: Sample, out: dict[str, Any]) -> None:
    """An engine's /generate reply (SGLang's native form) appended to the sample it continues."""
    meta = out["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    ids = [int(e[1]) for e in entries] or list(out.get("output_ids", []))
    logps = [float(e[0]) for e in entries]
    sample.append_response(ids, logps, versions=token_versions(meta, len(ids)))
    sample.response = out.get("text", "")
    sample.status = Status.from_finish_reason((meta.get("finish_reason") or {}).get("type", "stop"))
    sample.weight_versions.append(str(meta.get("weight_version", "")))
