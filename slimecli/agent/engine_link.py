"""The adapters' view of a rollout engine (SGLang's native API via slimecli's EngineClient): one turn's
generation with log-probs, and an abort when the turn is cancelled (the CLI went away)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from slimecli.rollout import client as engine_client
from slimecli.rollout.client import EngineError


@dataclass
class Generation:
    output_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # stop | length | abort
    weight_version: str | None = None
    matched: Any = None  # the stop token id or stop string that ended the output


class EngineLink:
    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.client = engine_client.EngineClient(base_url, timeout_s=timeout_s)

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @base_url.setter
    def base_url(self, value: str) -> None:
        self.client.base_url = value.rstrip("/")

    async def close(self) -> None:
        await self.client.close()

    async def healthy(self) -> bool:
        return await self.client.health_generate()

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None = None,
                       session: str | None = None) -> Generation:
        """One /generate call; cancelling the awaiting task aborts the request on the engine."""
        rid = rid or uuid.uuid4().hex
        try:
            data = await self.client.generate(input_ids, sampling_params=sampling_params, return_logprob=True,
                                              rid=rid)
        except asyncio.CancelledError:
            await asyncio.shield(self.abort(rid))
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # EngineError (HTTP errors) passes through
            raise EngineError(None, f"engine request failed: {exc}", self.base_url) from exc
        return _parse_generation(data)

    def release(self, session: str) -> None:
        """The session is over (one engine: nothing to forget)."""

    def assigned(self, session: str) -> int | None:
        """Every session is on the one engine."""
        return 0

    async def abort(self, rid: str) -> None:
        try:
            await asyncio.wait_for(self.client.abort(rid), 10.0)
        except (EngineError, aiohttp.ClientError, TimeoutError, OSError):
            pass


class EnginePool:
    """Several engines behind one adapter; each session sticks to the engine that served its first turn, so that
    engine's prefix cache holds the session's long shared context (the CLI's system prompt, the turns so far).
    A new session goes to the engine with the fewest sessions."""

    def __init__(self, base_urls: list[str], timeout_s: float = 600.0) -> None:
        if not base_urls:
            raise ValueError("an engine pool needs at least one engine")
        self.links = [EngineLink(url, timeout_s) for url in base_urls]
        self._sessions: dict[str, int] = {}
        self._load = [0] * len(self.links)

    @property
    def base_url(self) -> str:
        return self.links[0].base_url

    def engine_of(self, session: str) -> int:
        if session not in self._sessions:
            index = min(range(len(self.links)), key=lambda i: (self._load[i], i))
            self._sessions[session] = index
            self._load[index] += 1
        return self._sessions[session]

    def assigned(self, session: str) -> int | None:
        """The engine serving `session`, None before its first turn."""
        return self._sessions.get(session)

    def release(self, session: str) -> None:
        index = self._sessions.pop(session, None)
        if index is not None:
            self._load[index] -= 1

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links))

    async def healthy(self) -> bool:
        return all(await asyncio.gather(*(link.healthy() for link in self.links)))

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None = None,
                       session: str | None = None) -> Generation:
        link = self.links[self.engine_of(session) if session is not None else 0]
        return await link.generate(input_ids, sampling_params, rid)


def _parse_generation(data: Any) -> Generation:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(None, f"malformed engine reply: {str(data)[:300]}")
    meta = data["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    ids = [int(e[1]) for e in entries]
    if any(e[0] is None for e in entries):  # a zero in its place would be a wrong importance ratio, silently
        raise EngineError(None, "engine reply has an output token without a log-prob")
    log_probs = [float(e[0]) for e in entries]
    if not ids and data.get("output_ids"):
        raise EngineError(None, "engine reply has output ids but no output_token_logprobs (return_logprob ignored?)")
    finish = meta.get("finish_reason") or {}
    finish_type = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
    version = meta.get("weight_version")
    matched = finish.get("matched") if isinstance(finish, dict) else None
    return Generation(ids, log_probs, finish_type, None if version is None else str(version), matched)
