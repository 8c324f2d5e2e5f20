"""reward.judge_api=teacher: slimecli's teacher server as the judge.

The teacher server generates no text, but it scores any text (POST /generate: the log-prob of every token given
the ones before, PROTOCOLS.md §2). So the verdict is the candidate the teacher finds likeliest after the rendered
rubric: PASS or FAIL, or each whole score from 0 to reward.score_max, each scored as the sum of its tokens'
log-probs after the judge's prompt (the rubric as one user message of the teacher's chat template). The judge's
tokenizer is the teacher's own (its model_path, from GET /info). The verdict is always one of the candidates, so
it always parses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from slimecli.net.retry import TransientError
from slimecli.reward.verdict import VerdictForm

Post = Callable[[str, dict[str, Any]], Awaitable[Any]]
Get = Callable[[str], Awaitable[Any]]
MAX_SCORE_CANDIDATES = 101  # score_max at most 100 with the teacher: one scoring request a candidate


def candidates(form: VerdictForm) -> list[str]:
    """The verdicts the teacher chooses among."""
    if form.verdict == "pass_fail":
        return ["PASS", "FAIL"]
    return [str(k) for k in range(int(form.score_max) + 1)]


class TeacherJudge:
    """Picks a verdict by the teacher's log-probs; ``post`` and ``get`` are the judge client's (retried) calls."""

    def __init__(self, url: str, form: VerdictForm, post: Post, get: Get) -> None:
        self.url, self.form, self.post, self.get = url, form, post, get
        self._tokenizer: Any = None
        self._lock = asyncio.Lock()

    async def verdict(self, text: str) -> str:
        tok = await self.tokenizer()
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        prompt = [int(i) for i in (ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)]
        options = candidates(self.form)
        scores = await asyncio.gather(*(self._score(prompt, tok.encode(c, add_special_tokens=False))
                                        for c in options))
        return max(zip(scores, options, strict=True))[1]

    async def _score(self, prompt: list[int], ids: list[int]) -> float:
        """The log-prob of ``ids`` following ``prompt``: log_probs[i] scores token i + 1."""
        reply = await self.post(f"{self.url}/generate", {"input_ids": prompt + ids})
        logps = reply.get("log_probs") if isinstance(reply, dict) else None
        if not isinstance(logps, list) or len(logps) != len(prompt) + len(ids) - 1:
            raise TransientError(f"teacher reply has no log_probs for the verdict: {str(reply)[:80]!r}")
        return float(sum(logps[len(prompt) - 1:]))

    async def tokenizer(self) -> Any:
        async with self._lock:
            if self._tokenizer is None:
                info = await self.get(f"{self.url}/info")
                path = info.get("model_path") if isinstance(info, dict) else None
                if not path:
                    raise TransientError(f"teacher {self.url}/info names no model_path: {str(info)[:80]!r}")
                from slimecli.model.loading import load_tokenizer

                self._tokenizer = await asyncio.to_thread(load_tokenizer, str(path))
        return self._tokenizer
