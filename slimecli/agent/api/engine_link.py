"""The adapters' view of a rollout engine (SGLang's native API via slimecli's EngineClient): one turn's
generation with log-probs, and an abort when the turn is cancelled (the CLI went away).

With `on_progress`, the turn is generated with SGLang's `stream: true` and `on_progress(output_ids)` is awaited
for every chunk, so an adapter can show the reply while it is sampled. The Generation returned is built from the
chunks exactly as a non-streaming reply would be: chunks that repeat the whole output so far (SGLang's default,
and slimecli's engine) or that carry only the new tokens (SGLang's incremental streaming output) both give the
same ids and log-probs. An engine that ignores `stream` and answers one JSON reply is read as one chunk."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from slimecli.rollout import client as engine_client
from slimecli.rollout.client import EngineError
from slimecli.rollout.sample import token_versions


@dataclass
class Generation:
    output_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # stop | length | abort
    weight_version: str | None = None
    matched: Any = None  # the stop token id or stop string that ended the output
    token_versions: list[int] | None = None  # the weight version that sampled each output token


Progress = Callable[[list[int]], Awaitable[None]]


class EngineLink:
    def __init__(self, base_url: str, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        self.client = engine_client.EngineClient(base_url, timeout_s=timeout_s, api_key=api_key)

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
                       session: str | None = None, on_progress: Progress | None = None) -> Generation:
        """One /generate call; cancelling the awaiting task aborts the request on the engine (so does an error
        raised by `on_progress`: the client it streams to went away)."""
        rid = rid or uuid.uuid4().hex
        try:
            if on_progress is None:
                data = await self.client.generate(input_ids, sampling_params=sampling_params, return_logprob=True,
                                                  rid=rid)
                return _parse_generation(data)
            return await self._stream(input_ids, sampling_params, rid, on_progress)
        except _Downstream as exc:  # on_progress failed (its client went away): not the engine's fault
            await asyncio.shield(self.abort(rid))
            raise exc.error from None
        except EngineError:  # the engine answered: the request is over there
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await asyncio.shield(self.abort(rid))
            raise EngineError(None, f"engine request failed: {exc}", self.base_url) from exc
        except BaseException:  # cancelled: the client went away
            await asyncio.shield(self.abort(rid))
            raise

    async def _stream(self, input_ids: list[int], sampling_params: dict[str, Any], rid: str,
                      on_progress: Progress) -> Generation:
        body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": True, "rid": rid,
                "stream": True}
        url = self.base_url + "/generate"
        acc = _Accumulator()

        async def progress() -> None:
            try:
                await on_progress(acc.ids)
            except Exception as exc:
                raise _Downstream(exc) from exc

        async with self.client.session.post(url, json=body, headers=self.client.headers) as resp:
            if resp.status != 200:
                raise engine_client.engine_error(resp.status, engine_client._message(resp.status, await resp.text()),
                                                 url)
            if not resp.content_type.startswith("text/event-stream"):  # an engine that does not stream
                acc.add(json.loads(await resp.text()))
                await progress()
                return acc.generation()
            buffer = b""
            async for piece in resp.content.iter_any():  # events can be longer than aiohttp's line limit
                buffer += piece
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    data = b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
                    if not data:
                        continue
                    if data == b"[DONE]":
                        return acc.generation()
                    acc.add(json.loads(data))
                    await progress()
        return acc.generation()  # closed without [DONE]: the last chunk is the reply if it finished

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

    def __init__(self, base_urls: list[str], timeout_s: float = 600.0, api_key: str | None = None) -> None:
        if not base_urls:
            raise ValueError("an engine pool needs at least one engine")
        self.links = [EngineLink(url, timeout_s, api_key) for url in base_urls]
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
                       session: str | None = None, on_progress: Progress | None = None) -> Generation:
        link = self.links[self.engine_of(session) if session is not None else 0]
        if on_progress is None:
            return await link.generate(input_ids, sampling_params, rid)
        return await link.generate(input_ids, sampling_params, rid, on_progress=on_progress)


class _Downstream(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Accumulator:
    """Output ids and log-prob entries of a streamed reply, cumulative or incremental chunks alike."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.entries: list[Any] = []
        self.last: dict[str, Any] | None = None

    def add(self, data: Any) -> None:
        data = _reply_dict(data)
        meta = data["meta_info"]
        entries = meta.get("output_token_logprobs") or []
        if not isinstance(entries, list):
            raise EngineError(None, f"malformed engine reply: {str(data)[:300]}")
        total = meta.get("completion_tokens")
        incremental = isinstance(total, int) and len(entries) < total == len(self.entries) + len(entries)
        self.entries = self.entries + entries if incremental else list(entries)
        self.ids = [int(e[1]) for e in self.entries]
        self.last = data

    def generation(self) -> Generation:
        if self.last is None or self.last["meta_info"].get("finish_reason") is None:
            raise EngineError(None, "engine stream ended before its reply finished")
        return _parse_generation({**self.last, "meta_info": {**self.last["meta_info"],
                                                             "output_token_logprobs": self.entries}})


def _reply_dict(data: Any) -> dict[str, Any]:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(None, f"malformed engine reply: {str(data)[:300]}")
    return data


def _parse_generation(data: Any) -> Generation:
    data = _reply_dict(data)
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
    return Generation(ids, log_probs, finish_type, None if version is None else str(version), matched,
                      token_versions(meta, len(ids)))
