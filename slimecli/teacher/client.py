"""The trainer's side of on-policy distillation: teacher log-probs of each sample's response tokens.

teacher=server speaks slimecli's teacher API (PROTOCOLS.md §2); teacher=sglang asks an SGLang server for
input-token log-probs with max_new_tokens 0, which SGLang computes at temperature 1 whatever the request says:
so it scores at temperature 1 only. Requests are concurrency-limited and retried with
exponential backoff on connection errors, timeouts, 408, 429 and 5xx; any other 4xx fails at once
(slimecli.net.client).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from slimecli.config.groups.teacher import TeacherConfig
from slimecli.model.loading import PROBE_TEXT as PROBE_TEXT  # the tokenizer check lives in the model layer
from slimecli.model.loading import check_tokenizers_compatible as check_tokenizers_compatible
from slimecli.net.client import RetryingClient
from slimecli.net.probe import probe_ok
from slimecli.net.retry import HttpStatusError, RetryPolicy
from slimecli.rollout.sample import Sample


class TeacherError(RuntimeError):
    """The teacher refused or kept failing a request."""


def teacher_url(cfg: TeacherConfig) -> str:
    if cfg.url:
        return cfg.url.rstrip("/")
    from slimecli.config.layout import reachable_host

    return f"http://{reachable_host(cfg.host)}:{cfg.port}"


class TeacherClient(RetryingClient):
    """`async with TeacherClient(cfg) as c: logps = await c.score(samples)`.

    score() returns, per sample, the teacher's log-probs of its last `response_length` tokens (one float per
    response token, aligned with Sample.rollout_log_probs) at `temperature` (default teacher.temperature).
    """

    error = TeacherError

    def __init__(self, cfg: TeacherConfig, *, url: str | None = None, temperature: float | None = None,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0) -> None:
        if cfg.name not in ("server", "sglang"):
            raise ValueError(f"teacher={cfg.name} has no client (use teacher=server or teacher=sglang)")
        self.cfg, self.kind = cfg, cfg.name
        self.url = (url or teacher_url(cfg)).rstrip("/")
        self.temperature = cfg.temperature if temperature is None else temperature
        if self.kind == "sglang" and self.temperature != 1.0:  # config validation says so first (rules/teacher)
            raise ValueError(f"teacher=sglang scores at temperature 1 only (SGLang's input-token log-probs ignore "
                             f"the temperature), not {self.temperature}: use teacher=server")
        super().__init__(RetryPolicy(max_retries=max(0, cfg.max_retries), backoff_s=backoff_s,
                                     backoff_max_s=backoff_max_s), cfg.request_timeout_s, cfg.concurrency)
        if cfg.name == "server" and not cfg.url and cfg.max_restarts > 0:  # launched here: restarted when it dies
            self.recover, self.recoveries = self._wait_healthy, cfg.max_restarts

    async def _wait_healthy(self) -> None:
        """The supervisor restarts a dead teacher (teacher.max_restarts): wait until /healthz answers again, at most
        as long as noticing a hang and a start may take."""
        t = self.cfg
        deadline = time.monotonic() + t.health_timeout_s + t.health_interval_s + t.start_timeout_s + 30.0
        while time.monotonic() < deadline:
            if await asyncio.to_thread(probe_ok, self.url + "/healthz", 200, 5.0):
                return
            await asyncio.sleep(1.0)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        async def attempt() -> Any:
            async with self.limit, self.session.post(self.url + path, json=body, headers=self._headers()) as r:
                text = await r.text()
                if r.status != 200:
                    raise HttpStatusError(r.status, text[:500])
                return await r.json(content_type=None)

        return await self.call(attempt, f"teacher {self.url}{path}")

    async def score_tokens(self, tokens: Sequence[int], response_length: int) -> list[float]:
        """Teacher log-probs of tokens[-response_length:], each given all tokens before it."""
        tokens = [int(t) for t in tokens]
        if response_length == 0:
            return []
        if not 0 < response_length < len(tokens):
            raise ValueError(f"response_length={response_length} needs a non-empty prompt before it "
                             f"({len(tokens)} tokens)")
        if self.kind == "server":
            reply = await self._post("/generate", {"input_ids": tokens, "temperature": self.temperature})
            logps = reply.get("log_probs") if isinstance(reply, dict) else None
            if not isinstance(logps, list) or len(logps) != len(tokens) - 1:
                raise TeacherError(f"teacher {self.url} returned {_short(reply)} instead of {len(tokens) - 1} "
                                   "log_probs")
            return [float(x) for x in logps[len(logps) - response_length:]]
        return await self._score_sglang(tokens, response_length)

    async def _score_sglang(self, tokens: list[int], response_length: int) -> list[float]:
        """Prefill-only scoring on SGLang's /generate (or `slimecli rollout serve`, which answers the same).

        With logprob_start_len = prompt_length - 1, meta_info.input_token_logprobs holds one
        [logprob, token_id, text] entry per input position from there on: the first (the prompt's last token)
        has logprob None, the response_length after it are the teacher's log-probs of the response tokens.
        """
        prompt_length = len(tokens) - response_length
        body = {"input_ids": tokens, "return_logprob": True, "logprob_start_len": prompt_length - 1,
                "sampling_params": {"max_new_tokens": 0, "temperature": self.temperature}}
        reply = await self._post("/generate", body)
        if isinstance(reply, list) and len(reply) == 1:
            reply = reply[0]
        entries = (reply.get("meta_info") or {}).get("input_token_logprobs") if isinstance(reply, dict) else None
        if not isinstance(entries, list):
            raise TeacherError(f"SGLang teacher {self.url} returned no meta_info.input_token_logprobs: "
                               f"{_short(reply)}")
        tail = entries[max(len(entries) - response_length, 0):]
        if len(tail) < response_length or not all(isinstance(e, list | tuple) and len(e) >= 2
                                                  and isinstance(e[0], int | float) for e in tail):
            raise TeacherError(f"SGLang teacher {self.url} scored {len(entries)} input positions, need a log-prob "
                               f"for each of the last {response_length}: {_short(entries[-3:])}")
        if [int(e[1]) for e in tail] != tokens[prompt_length:]:
            raise TeacherError(f"SGLang teacher {self.url} scored other token ids than the sample's response")
        return [float(e[0]) for e in tail]

    async def score(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Teacher log-probs of each sample's response tokens, in order (requests run concurrently)."""
        return list(await asyncio.gather(*(self.score_tokens(s.tokens, s.response_length) for s in samples)))

    async def info(self) -> dict[str, Any]:
        """GET /info of a teacher=server (vocab_size, temperature, model_path, ...); SGLang's /get_model_info
        (model_path, tokenizer_path) of a teacher=sglang."""
        path = "/info" if self.kind == "server" else "/get_model_info"
        async with self.session.get(self.url + path, headers=self._headers()) as r:
            if r.status != 200:
                raise TeacherError(f"teacher {self.url}{path}: HTTP {r.status}: {(await r.text())[:300]}")
            reply = await r.json(content_type=None)
        if not isinstance(reply, dict):
            raise TeacherError(f"teacher {self.url}{path} returned {_short(reply)}")
        return reply

    async def encode(self, text: str) -> list[int]:
        """The token ids the teacher's own tokenizer gives ``text`` (SGLang: a prefill of the text that returns
        its input tokens), for comparing its tokenizer with the student's where its files are not here."""
        body = {"text": text, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}
        reply = await self._post("/generate", body)
        if isinstance(reply, list) and len(reply) == 1:
            reply = reply[0]
        entries = (reply.get("meta_info") or {}).get("input_token_logprobs") if isinstance(reply, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, list | tuple) and len(e) >= 2 for e in entries):
            raise TeacherError(f"teacher {self.url} returned no input token ids for a text: {_short(reply)}")
        return [int(e[1]) for e in entries]


class TeacherPool:
    """Several teacher servers as one (teacher.every_node): each sample goes to the next server in turn."""

    def __init__(self, cfg: TeacherConfig, urls: Sequence[str], temperature: float | None = None) -> None:
        if not urls:
            raise ValueError("a teacher pool needs at least one URL")
        self.clients = [TeacherClient(cfg, url=url, temperature=temperature) for url in urls]

    async def score(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Teacher log-probs of each sample's response tokens, in order; sample i is scored by server i mod n."""
        n = len(self.clients)
        return list(await asyncio.gather(*(self.clients[i % n].score_tokens(s.tokens, s.response_length)
                                           for i, s in enumerate(samples))))

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) < 300 else text[:300] + "..."
