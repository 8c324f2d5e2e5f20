"""Async client for a rollout engine speaking SGLang's native HTTP API (slimecli's own engine or SGLang).

Used by the trainer (generation, weight sync) and the agent adapters. One aiohttp session per client;
use `async with EngineClient(url) as c:` or call `close()`.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from slimecli.engine.bodies import AWAITING_WEIGHTS
from slimecli.net.auth import engine_api_key
from slimecli.net.probe import poll_delays
from slimecli.net.retry import RetryPolicy, with_retries

T = TypeVar("T")
Recovery = Callable[["EngineClient"], Awaitable[None]]
# set inside a recovery: its own requests to the engine must not wait for the recovery they are part of
_IN_RECOVERY: contextvars.ContextVar[bool] = contextvars.ContextVar("slimecli_engine_recovery", default=False)
MAX_RECOVERIES = 8  # per request: an engine that keeps going away is not waited for forever


class EngineError(RuntimeError):
    """The engine answered with an error status (`message` is the engine's), or could not be reached or
    answered junk (`status` None). The one engine error of slimecli: the trainer, agent adapters and tests
    catch this."""

    def __init__(self, status: int | None, message: str, url: str = "") -> None:
        where = f"{url}: " if url else ""
        super().__init__(f"{where}HTTP {status}: {message}" if status is not None else f"{where}{message}")
        self.status, self.message = status, message


class EngineRejected(EngineError):
    """HTTP 400: the request itself is bad (e.g. a grammar the engine cannot compile), not the engine."""


def engine_error(status: int, message: str, url: str) -> EngineError:
    return (EngineRejected if status == 400 else EngineError)(status, message, url)


def _message(status: int, text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip() or f"HTTP {status}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        if err is not None:
            return str(err)
        if "message" in body:
            return str(body["message"])
    return text


def engine_lost(exc: BaseException) -> bool:
    """The engine went away (refused, reset, closed mid-reply) or came back restarted and waits for weights."""
    if isinstance(exc, EngineError):
        return exc.status == 503 and AWAITING_WEIGHTS in exc.message
    return isinstance(exc, aiohttp.ClientConnectionError) and not isinstance(exc, aiohttp.InvalidURL)


def _engine_busy(exc: BaseException) -> bool:
    """/flush_cache answers 400 while requests are running or waiting: worth another try."""
    return isinstance(exc, EngineError) and exc.status == 400


class EngineClient:
    """api_key: sent as `Authorization: Bearer` on every request (None: $SLIMECLI_ENGINE_API_KEY, if set)."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, session: aiohttp.ClientSession | None = None,
                 api_key: str | None = None, pause_mode: str = "abort") -> None:
        self.base_url = base_url.rstrip("/")
        # how a weight sync pauses generation: abort (nothing is in flight then), or, with partial rollouts,
        # in_place / retract (the requests in flight keep their tokens and go on under the new weights)
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        self.api_key = api_key or engine_api_key()
        self._session = session
        self._own_session = session is None
        self.has_update_session: bool | None = None  # SGLang's /begin_weight_update: None until first asked
        self.old_server_info = False  # the server knows only /get_server_info
        self.lora_name: str | None = None  # the LoRA adapter loaded last (trainer.lora): generations name it
        # set by the trainer (train/coordinator/recovery.py): a request that finds the engine gone waits for its
        # restart and weights, then is sent again; None: the error is raised
        self.recovery: Recovery | None = None
        self._recovering: asyncio.Future[None] | None = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  connector=aiohttp.TCPConnector(limit=0))
            self._own_session = True
        return self._session

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def close(self) -> None:
        if self._own_session and self._session is not None and not self._session.closed:
            await self._session.close()

    async def _resilient(self, send: Callable[[], Awaitable[T]]) -> T:
        """``await send()``; where the engine is lost and a recovery is set, once it is back, again (every request
        waits for a recovery under way, so none reaches a restarted engine before its weights)."""
        for attempt in range(MAX_RECOVERIES + 1):
            if self._recovering is not None and not _IN_RECOVERY.get():
                await asyncio.shield(self._recovering)
            try:
                return await send()
            except (aiohttp.ClientError, EngineError) as exc:
                if self.recovery is None or _IN_RECOVERY.get() or not engine_lost(exc) or attempt == MAX_RECOVERIES:
                    raise
            await self._recover()
        raise AssertionError("unreachable")

    async def _recover(self) -> None:
        """One recovery at a time per engine, shared by every request that found it gone."""
        if self._recovering is None or self._recovering.done():
            assert self.recovery is not None
            recovery = self.recovery

            async def run() -> None:
                _IN_RECOVERY.set(True)
                await recovery(self)

            self._recovering = asyncio.ensure_future(run())
        try:
            await asyncio.shield(self._recovering)
        finally:
            if self._recovering is not None and self._recovering.done():
                self._recovering = None

    async def _request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,),
                       timeout_s: float | None = None) -> Any:
        return await self._resilient(lambda: self._request_once(method, path, body, ok, timeout_s))

    async def _request_once(self, method: str, path: str, body: Any, ok: tuple[int, ...],
                            timeout_s: float | None) -> Any:
        url = self.base_url + path
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
        async with self.session.request(method, url, json=body, timeout=timeout, headers=self.headers) as resp:
            text = await resp.text()
            if resp.status not in ok:
                raise engine_error(resp.status, _message(resp.status, text), url)
            if not text:
                return None
            try:
                return json.loads(text)
            except ValueError:
                return text

    # ---- generation ----------------------------------------------------------------------------
    @staticmethod
    def _generate_body(input_ids: Any, text: Any, sampling_params: Any, return_logprob: bool, rid: Any,
                       extra: dict[str, Any]) -> dict[str, Any]:
        if (input_ids is None) == (text is None):
            raise ValueError("give exactly one of input_ids and text")
        body: dict[str, Any] = {"input_ids": input_ids} if input_ids is not None else {"text": text}
        body["sampling_params"] = sampling_params or {}
        body["return_logprob"] = return_logprob
        if rid is not None:
            body["rid"] = rid
        body.update(extra)
        return body

    def _with_adapter(self, body: dict[str, Any]) -> dict[str, Any]:
        """SGLang serves a LoRA adapter only to requests that name it: name the one last loaded (trainer.lora)."""
        if self.lora_name is not None and "lora_path" not in body:
            body["lora_path"] = self.lora_name
        return body

    async def generate(self, input_ids: list[int] | list[list[int]] | None = None, *,
                       text: str | list[str] | None = None, sampling_params: dict[str, Any] | list[dict] | None = None,
                       return_logprob: bool = False, rid: str | list[str] | None = None, **extra: Any
                       ) -> dict[str, Any] | list[dict[str, Any]]:
        """POST /generate; a single prompt gives a dict, a batch (or n > 1) a list in input order."""
        body = self._with_adapter(self._generate_body(input_ids, text, sampling_params, return_logprob, rid, extra))
        return await self._request("POST", "/generate", body)

    async def generate_stream(self, input_ids: list[int] | None = None, *, text: str | None = None,
                              sampling_params: dict[str, Any] | None = None, return_logprob: bool = False,
                              rid: str | None = None, **extra: Any) -> AsyncIterator[dict[str, Any]]:
        """POST /generate with stream=true; yields the cumulative reply dicts until the engine sends [DONE]."""
        body = self._with_adapter(self._generate_body(input_ids, text, sampling_params, return_logprob, rid,
                                                      {**extra, "stream": True}))
        url = self.base_url + "/generate"
        async with self.session.post(url, json=body, headers=self.headers) as resp:
            if resp.status != 200:
                raise engine_error(resp.status, _message(resp.status, await resp.text()), url)
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                yield json.loads(data)

    # ---- control ---------------------------------------------------------------------------------
    async def abort(self, rid: str | None = None, all: bool = False) -> Any:  # the API's own word
        body: dict[str, Any] = {"abort_all": True} if all else {"rid": rid}
        if not all and rid is None:
            raise ValueError("abort: give rid or all=True")
        return await self._request("POST", "/abort_request", body)

    async def pause(self, mode: str | None = None) -> Any:
        return await self._request("POST", "/pause_generation", {"mode": mode or self.pause_mode})

    @property
    def keeps_requests(self) -> bool:
        """A weight sync's pause keeps the requests in flight (partial rollouts): the cache cannot be flushed
        then (the engine drops its prefix cache itself when new weights land)."""
        return self.pause_mode != "abort"

    async def resume(self) -> Any:
        return await self._request("POST", "/continue_generation", {})

    async def flush_cache(self, timeout_s: float = 60.0) -> bool:
        """POST /flush_cache, retrying while requests are still running (the engine answers 400 then)."""
        policy = RetryPolicy(max_retries=None, backoff_s=0.2, backoff_max_s=0.2, timeout_s=timeout_s)
        await with_retries(lambda: self._request("POST", "/flush_cache", {}), policy, retryable=_engine_busy)
        return True

    async def update_weights_from_disk(self, path: str, weight_version: str | int | None = None, *,
                                       flush_cache: bool = True, abort_all_requests: bool = False) -> dict[str, Any]:
        """Load new weights; returns {"success", "message", ...}. A failed load returns success=False (the
        engine keeps serving its old weights); it does not raise."""
        body: dict[str, Any] = {"model_path": str(path), "flush_cache": flush_cache,
                                "abort_all_requests": abort_all_requests}
        return await self._update("/update_weights_from_disk", body, weight_version)

    async def update_weights_from_shared_memory(self, segment: str, tensors: list[dict[str, Any]],
                                                weight_version: str | int | None = None,
                                                lora_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """slimecli's engine only: copy the tensors a manifest places in a shared-memory segment (``lora_config``:
        they are a LoRA adapter in peft's names, which the engine merges into its base weights)."""
        body: dict[str, Any] = {"segment": segment, "tensors": tensors}
        if lora_config is not None:
            body["lora_config"] = lora_config
        return await self._update("/update_weights_from_shared_memory", body, weight_version)

    async def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        """SGLang's ``/load_lora_adapter {"lora_name", "lora_path"}`` (a peft adapter directory): its
        {"success", "error_message", "loaded_adapters"}; a refusal does not raise."""
        return await self._update("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, None)

    async def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        return await self._update("/unload_lora_adapter", {"lora_name": name}, None)

    async def update_weight_version(self, version: str | int) -> dict[str, Any]:
        """SGLang's ``/update_weight_version {"new_version"}``: the version later generations report (requests in
        flight go on: SGLang's default aborts them)."""
        return await self._update("/update_weight_version", {"new_version": str(version), "abort_all_requests": False},
                                  None)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str) -> dict[str, Any]:
        """SGLang's: join the weight-update group (answers once every member has joined)."""
        body = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                "world_size": world_size, "group_name": group_name, "backend": backend}
        return await self._update("/init_weights_update_group", body, None)

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              group_name: str, weight_version: str | int | None = None, *,
                                              flush_cache: bool = True) -> dict[str, Any]:
        """SGLang's: receive these tensors by broadcast from rank 0 of the group (which sends them meanwhile).
        ``flush_cache``: drop the prefix cache after loading them (an update's last bucket; once is enough)."""
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                "flush_cache": flush_cache}
        return await self._update("/update_weights_from_distributed", body, weight_version)

    async def begin_weight_update(self) -> bool:
        """SGLang's weight-update session (mid-2026 on): update_weights_from_distributed is refused outside
        one. True: a session is open; False: this engine predates sessions (it answered 404), and updates
        run without one. Any other refusal raises EngineError."""
        if self.has_update_session is False:
            return False
        url = self.base_url + "/begin_weight_update"
        async with self.session.post(url, json={}, headers=self.headers) as resp:
            text = await resp.text()
            if resp.status == 404:
                self.has_update_session = False
                return False
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if resp.status != 200 or (isinstance(data, dict) and data.get("success") is False):
                raise engine_error(resp.status, _message(resp.status, text), url)
        self.has_update_session = True
        return True

    async def end_weight_update(self) -> dict[str, Any]:
        """Close the session begin_weight_update opened (SGLang finalises the new weights here)."""
        return await self._update("/end_weight_update", {}, None)

    async def destroy_weights_update_group(self, group_name: str) -> dict[str, Any]:
        return await self._update("/destroy_weights_update_group", {"group_name": group_name}, None)

    async def _update(self, path: str, body: dict[str, Any], weight_version: str | int | None) -> dict[str, Any]:
        """POST a weight-update request: the engine's {"success", "message"} whether it succeeded or not."""
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        return await self._resilient(lambda: self._update_once(path, body))

    async def _update_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        async with self.session.post(url, json=body, headers=self.headers) as resp:
            text = await resp.text()
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if isinstance(data, dict) and "success" in data:
                return data
            raise engine_error(resp.status, _message(resp.status, text), url)

    async def sync_weights(self, path_or_update: str | Callable[[], Awaitable[dict[str, Any]]],
                           weight_version: str | int | None = None) -> dict[str, Any]:
        """The RL weight-sync sequence: pause -> flush -> update -> continue (no flush where the pause keeps the
        requests in flight). The update is a checkpoint directory (update_weights_from_disk) or a coroutine
        function that performs another kind."""
        await self.pause()
        try:
            if not self.keeps_requests:
                await self.flush_cache()
            if isinstance(path_or_update, str):
                return await self.update_weights_from_disk(path_or_update, weight_version)
            return await path_or_update()
        finally:
            await self.resume()

    # ---- status ----------------------------------------------------------------------------------
    async def health(self) -> bool:
        try:
            await self._request_once("GET", "/health", None, (200,), 10)
            return True
        except (TimeoutError, EngineError, aiohttp.ClientError):
            return False

    async def health_generate(self, timeout_s: float = 30.0) -> bool:
        try:
            await self._request_once("GET", "/health_generate", None, (200,), timeout_s)
            return True
        except (TimeoutError, EngineError, aiohttp.ClientError):
            return False

    async def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> None:
        """Poll /health_generate until it answers 200; TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        delays = poll_delays(poll_s)
        while time.monotonic() < deadline:
            if await self.health_generate(timeout_s=max(1.0, min(30.0, deadline - time.monotonic()))):
                return
            await asyncio.sleep(next(delays))
        raise TimeoutError(f"{self.base_url} was not ready within {timeout_s:.0f}s")

    async def get_model_info(self) -> dict[str, Any]:
        return await self._request("GET", "/get_model_info")

    async def get_server_info(self) -> dict[str, Any]:
        """GET /server_info (SGLang 0.5.x deprecates /get_server_info); /get_server_info on a server that
        answers 404 to the new name (older SGLang), remembered."""
        if not self.old_server_info:
            try:
                return await self._request("GET", "/server_info")
            except EngineError as exc:
                if exc.status != 404:
                    raise
                self.old_server_info = True
        return await self._request("GET", "/get_server_info")

    async def get_loads(self, include: str | None = None) -> dict[str, Any]:
        """GET /v1/loads (SGLang's shape: {"timestamp", "version", ..., "loads": [one per DP rank]})."""
        return await self._request("GET", "/v1/loads" + (f"?include={include}" if include else ""))
