"""What slimecli's retrying JSON clients share (the teacher client, the remote reward): one aiohttp session opened
on first use, at most `concurrency` requests in flight, and calls retried per a RetryPolicy (slimecli.net.retry)
whose last failure becomes the client's own error, worded alike: "rejected the request" for what is not worth
another try (a 4xx but 408/429), "failed after N attempts" for what kept failing. A client whose server is
restarted by the supervisor sets `recover`: a call whose retries all failed to connect waits for it, then
starts over, `recoveries` times at most."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import aiohttp

from slimecli.net.retry import HttpStatusError, RetryPolicy, TransientError, describe, is_retryable, with_retries

T = TypeVar("T")


class RetryingClient:
    """Base of a client: `async with Client(...) as c:` or call `close()`; subclasses set `error`."""

    error: type[Exception] = RuntimeError  # what a call that does not succeed raises

    def __init__(self, retry: RetryPolicy, timeout_s: float, concurrency: int) -> None:
        self.retry = retry
        self.timeout_s = timeout_s
        self.concurrency = max(1, int(concurrency))
        self.limit = asyncio.Semaphore(self.concurrency)
        self._session: aiohttp.ClientSession | None = None
        self.recover: Callable[[], Awaitable[None]] | None = None  # wait until the server is back after a restart
        self.recoveries = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # the semaphore is the limit, not aiohttp's default of 100 connections
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  connector=aiohttp.TCPConnector(limit=self.concurrency))
        return self._session

    async def post_json(self, url: str, body: bytes, headers: dict[str, str], timeout_setting: str) -> Any:
        """One POST of a JSON body within the concurrency limit: the reply's JSON. A status >= 400 raises
        HttpStatusError, a timeout (``timeout_setting`` names its bound) or a reply that is not JSON TransientError:
        what ``call`` retries or refuses."""
        async with self.limit:
            try:
                async with self.session.post(url, data=body, headers=headers) as resp:
                    text = await resp.text(errors="replace")
                    status = resp.status
            except TimeoutError:
                raise TransientError(f"no reply within {timeout_setting}") from None
        if status >= 400:
            raise HttpStatusError(status, f"{text[:200]!r}")
        try:
            return json.loads(text)
        except ValueError:
            raise TransientError(f"reply is not JSON: {text[:80]!r}") from None

    async def call(self, attempt: Callable[[], Awaitable[T]], where: str) -> T:
        """`await attempt()` with retries; `self.error` naming `where` (a server, a URL) when it never succeeds."""
        rounds = 0
        while True:
            try:
                return await with_retries(attempt, self.retry)
            except aiohttp.ClientConnectionError as exc:
                if self.recover is None or rounds >= self.recoveries:
                    raise self._failure(exc, where) from exc
            except (HttpStatusError, TransientError, aiohttp.ClientError, TimeoutError) as exc:
                raise self._failure(exc, where) from exc
            rounds += 1
            await self.recover()

    def _failure(self, exc: BaseException, where: str) -> Exception:
        if not is_retryable(exc):
            return self.error(f"{where} rejected the request ({exc}); not retried")
        attempts = self.retry.attempts
        return self.error(f"{where} failed after {attempts} attempt{'s' if attempts != 1 else ''}: {describe(exc)}")
