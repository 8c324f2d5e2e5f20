"""reward=remote: an HTTP reward model. POST {prompt, response, label, metadata} as JSON to
reward.url; the JSON reply is the raw reward (a number, or a dict read through reward.key).

Transient failures (connection errors, timeouts, 5xx, 408/429, a reply that is not JSON) are
retried reward.max_retries times with exponential backoff and jitter (slimecli.net.retry); other
4xx are not. At most reward.concurrency requests are in flight. After the last attempt
RemoteRewardError names the url and the last failure.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from slimecli.net.retry import HttpStatusError, RetryPolicy, TransientError, describe, is_retryable, with_retries


class RemoteRewardError(RuntimeError):
    """The reward server did not give a usable answer."""


def payload(sample: Any) -> dict[str, Any]:
    return {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
            "metadata": sample.metadata}


class RemoteReward:
    """Callable per-sample reward backed by one aiohttp session; use as `async with`."""

    def __init__(self, url: str, timeout_s: float = 60.0, max_retries: int = 3, concurrency: int = 32,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0):
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.timeout_s = timeout_s
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.retry = RetryPolicy(max_retries=self.max_retries, backoff_s=backoff_s, backoff_max_s=backoff_max_s)
        self.concurrency = max(1, int(concurrency))
        self._semaphore = asyncio.Semaphore(self.concurrency)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RemoteReward:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _delay(self, attempt: int) -> float:
        """Exponential backoff with jitter: uniform in [0.5, 1.5) x base x 2^attempt, capped."""
        return self.retry.delay(attempt)

    async def _attempt(self, body: bytes) -> Any:
        """The reward of one request; raises what with_retries classifies (RemoteRewardError: refused)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.concurrency)  # the semaphore is the limit, not aiohttp's 100
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        async with self._semaphore:
            try:
                async with self._session.post(self.url, data=body,
                                              headers={"Content-Type": "application/json"}) as resp:
                    text = await resp.text(errors="replace")
                    status = resp.status
            except TimeoutError:
                raise TransientError(f"no reply within reward.timeout_s={self.timeout_s}s") from None
        if status >= 400:
            failure = HttpStatusError(status, f"{text[:200]!r}")
            if not is_retryable(failure):
                raise RemoteRewardError(f"reward server {self.url} rejected the request ({failure}); not retried")
            raise failure
        try:
            return json.loads(text)
        except ValueError:
            raise TransientError(f"reply is not JSON: {text[:80]!r}") from None

    async def __call__(self, sample: Any) -> Any:
        body = json.dumps(payload(sample), default=str).encode()
        attempts = self.max_retries + 1
        try:
            return await with_retries(lambda: self._attempt(body), self.retry)
        except (HttpStatusError, TransientError, aiohttp.ClientError) as exc:
            raise RemoteRewardError(f"reward server {self.url} failed after {attempts} attempt"
                                    f"{'s' if attempts != 1 else ''}: {describe(exc)}") from exc
