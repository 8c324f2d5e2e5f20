"""A long-tail rollout workload for bench_async.py (rollout.generate=bench/long_tail.py:collector): the
single-turn quickstart rollout, but 1 prompt in 8 (by its place in the prompt stream) is sampled with 8x
rollout.max_new_tokens and ignore_eos, as a reasoning or agent rollout's few long samples are."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.data import PromptSource
from slimecli.rollout.driver import RolloutDriver
from slimecli.rollout.sample import Sample

EVERY = 8  # one prompt in EVERY is long
FACTOR = 8  # its samples get FACTOR x max_new_tokens
_LONG: ContextVar[bool] = ContextVar("long_tail_long", default=False)


class LongTailDriver(RolloutDriver):
    async def _generate(self, copies: list[Sample], key: tuple[Any, ...] | None = None, first: int = 0) -> None:
        token = _LONG.set(key is not None and int(key[-1]) % EVERY == 0)  # key: ("rollout", position)
        try:
            await super()._generate(copies, key, first)
        finally:
            _LONG.reset(token)

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        params = super().sampling_params(max_new_tokens)
        if _LONG.get():
            params.update(max_new_tokens=max_new_tokens * FACTOR, ignore_eos=True)
        return params


def collector(cfg: SlimeConfig, tokenizer: Any, engines: list[Any], source: PromptSource) -> LongTailDriver:
    return LongTailDriver(cfg, tokenizer, engines, source)
