"""The adapters' async link to a rollout engine speaking SGLang's native API (/generate, /abort_request)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp


class EngineError(Exception):
    """The engine refused or failed a request (the adapter answers with an API error, never a 500)."""


@dataclass
class Generation:
    output_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # stop | length | abort
    weight_version: str | None = None
    matched: Any = None  # the stop token id or stop string that ended the output


class EngineLink:
    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def healthy(self) -> bool:
        try:
            http = await self._http()
            async with http.get(f"{self.base_url}/health_generate", timeout=aiohttp.ClientTimeout(total=30)) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], rid: str | None = None
                       ) -> Generation:
        """One /generate call; cancelling the awaiting task aborts the request on the engine."""
        rid = rid or uuid.uuid4().hex
        body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": True, "rid": rid}
        http = await self._http()
        try:
            async with http.post(f"{self.base_url}/generate", json=body) as r:
                data = await r.json(content_type=None)
                if r.status != 200:
                    raise EngineError(f"engine answered {r.status}: {str(data)[:300]}")
        except asyncio.CancelledError:
            await asyncio.shield(self.abort(rid))
            raise
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise EngineError(f"engine request failed: {exc!r}") from exc
        return _parse_generation(data)

    async def abort(self, rid: str) -> None:
        try:
            http = await self._http()
            async with http.post(f"{self.base_url}/abort_request", json={"rid": rid},
                                 timeout=aiohttp.ClientTimeout(total=10)):
                pass
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass


def _parse_generation(data: Any) -> Generation:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(f"malformed engine reply: {str(data)[:300]}")
    meta = data["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    ids = [int(e[1]) for e in entries]
    log_probs = [float(e[0]) if e[0] is not None else 0.0 for e in entries]
    if not ids and data.get("output_ids"):
        raise EngineError("engine reply has output ids but no output_token_logprobs (return_logprob ignored?)")
    finish = meta.get("finish_reason") or {}
    finish_type = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
    version = meta.get("weight_version")
    matched = finish.get("matched") if isinstance(finish, dict) else None
    return Generation(ids, log_probs, finish_type, None if version is None else str(version), matched)
