"""One retry loop for slimecli's HTTP clients (teacher client, remote reward, engine client).

`with_retries(attempt, policy)` awaits `attempt()` until it returns, retrying what `retryable` accepts
after an exponential backoff with jitter: uniform in [0.5, 1.5) x min(backoff_max_s, backoff_s x 2^n)
before retry n+1. Retryable by default: connection errors, timeouts, HTTP 408, 429 and 5xx
(`HttpStatusError`, aiohttp's ClientResponseError) and `TransientError`; other 4xx are not. When the
retries are spent (max_retries, or no retry could start before policy.timeout_s) the last exception is
raised as it is, so a caller tells "refused" (not retryable) from "kept failing" with `is_retryable`.

`sleep`, `rand` and `clock` are injectable so that tests run without waiting.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

T = TypeVar("T")


class HttpStatusError(Exception):
    """A reply with a status that is not success; `text` is (the start of) its body."""

    def __init__(self, status: int, text: str = "") -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status = status
        self.text = text


class TransientError(Exception):
    """A failure worth another attempt (a reply that is not JSON, a timeout described by the caller)."""


def retryable_status(status: int) -> bool:
    """408 (request timeout), 429 (too many requests) and 5xx are worth another try; other 4xx are not."""
    return status in (408, 429) or status >= 500


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, HttpStatusError | aiohttp.ClientResponseError):
        return retryable_status(exc.status)
    return isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError)


def describe(exc: BaseException) -> str:
    """A one-line account of a failed attempt, for the caller's final error."""
    if isinstance(exc, HttpStatusError | TransientError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int | None = 3  # retries after the first attempt; None: until timeout_s
    backoff_s: float = 0.5  # the base delay before the first retry, doubled for each further one
    backoff_max_s: float = 30.0  # cap on the base delay
    timeout_s: float | None = None  # no retry starts later than this after the first attempt began

    def __post_init__(self) -> None:
        if self.max_retries is None and self.timeout_s is None:
            raise ValueError("a retry policy needs max_retries or timeout_s (or both)")

    @property
    def attempts(self) -> int | None:
        """How many attempts at most (None: bounded by timeout_s only)."""
        return None if self.max_retries is None else max(0, self.max_retries) + 1

    def delay(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number `retry` + 1 (0-based)."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** retry) * (0.5 + rand())


async def with_retries(attempt: Callable[[], Awaitable[T]], policy: RetryPolicy, *,
                       retryable: Callable[[BaseException], bool] = is_retryable,
                       sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                       rand: Callable[[], float] = random.random,
                       clock: Callable[[], float] = time.monotonic) -> T:
    """`await attempt()`, retried per `policy` while `retryable(exc)`; the last exception when spent."""
    start = clock()
    retry = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            if policy.max_retries is not None and retry >= policy.max_retries:
                raise
            delay = policy.delay(retry, rand)
            if policy.timeout_s is not None and clock() + delay - start > policy.timeout_s:
                raise
        await sleep(delay)
        retry += 1
