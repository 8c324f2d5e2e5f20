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
        budget = self.cfg.rollout.max_new_tokens - copies[0].response_length
        if budget <= 0:
            for sample in copies:
                sample.status = Status.TRUNCATED
            return
        engine = self.engines[next(self._engine_cycle)]
        params = self.sampling_params(budget)
        prompt: list[int] | list[list[int]] = list(copies[0].tokens)
        sampling: dict[str, Any] | list[dict[str, Any]] = params
        if key is not None:
            prompt = [list(copies[0].tokens) for _ in copies]
            sampling = [{**params, "sampling_seed": sample_seed(self.cfg.run.seed, *key, first + j)}
                        for j in range(len(copies))]
        elif len(copies) > 1:
            params["n"] = len(copies)
        async with self._limit:
            out = await engine.generate(input_ids=prompt, sampling_params=sampling, return_logprob=True)
        replies = out if isinstance(out, list) else [out]
        if len(replies) != len(copies):
            raise RuntimeError(f"engine {engine.base_url} answered {len(replies)} samples for n={len(copies)}")
        for sample, reply in zip(copies, replies, strict=True):
            record_reply(sample, reply)

    async def _group(self, record: dict[str, Any], group_index: int) -> list[Sample]:
        prompt_ids = self.encode_prompt(record["prompt"])
        n = self.cfg.rollout.n_samples_per_prompt
        group = []
        for _ in range(n):
            group.append(Sample(prompt=record["prompt"], label=record.get("label"), group_index=group_index,
                                index=self._next_index, tokens=list(prompt_ids),
                                metadata=dict(record.get("metadata") or {})))
            self._next_index += 1
        key = self.group_key(record, group_index)
        await asyncio.gather(*(self._generate(group[i:i + MAX_COPIES], key, i) for i in range(0, n, MAX_COPIES)))
        return group

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
