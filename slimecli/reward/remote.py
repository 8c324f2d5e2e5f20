"""reward=remote: an HTTP reward model. POST {prompt, response, label, metadata} as JSON to
reward.url; the JSON reply is the raw reward (a number, or a dict read through reward.key).

Transient failures (connection errors, timeouts, 5xx, 408/429, a reply that is not JSON) are
retried reward.max_retries times with exponential backoff and jitter (slimecli.net.client); other
4xx are not. At most reward.concurrency requests are in flight. After the last attempt
RemoteRewardError names the url and the last failure.
"""

from __future__ import annotations

import json
from typing import Any

from slimecli.net.client import RetryingClient
from slimecli.net.retry import RetryPolicy


class RemoteRewardError(RuntimeError):
    """The reward server did not give a usable answer."""


def payload(sample: Any) -> dict[str, Any]:
    return {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
            "metadata": sample.metadata}


class RemoteReward(RetryingClient):
    """Callable per-sample reward backed by one aiohttp session; use as `async with`."""

    error = RemoteRewardError

    def __init__(self, url: str, timeout_s: float = 60.0, max_retries: int = 3, concurrency: int = 32,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0):
        super().__init__(RetryPolicy(max_retries=max(0, int(max_retries)), backoff_s=backoff_s,
                                     backoff_max_s=backoff_max_s), timeout_s, concurrency)
        self.url = url

    def _delay(self, attempt: int) -> float:
        """Exponential backoff with jitter: uniform in [0.5, 1.5) x base x 2^attempt, capped."""
        return self.retry.delay(attempt)

    async def _attempt(self, body: bytes) -> Any:
        """The reward of one request; raises what RetryingClient.call classifies."""
        return await self.post_json(self.url, body, {"Content-Type": "application/json"},
                                    f"reward.timeout_s={self.timeout_s}s")

    async def __call__(self, sample: Any) -> Any:
        body = json.dumps(payload(sample), default=str).encode()
        return await self.call(lambda: self._attempt(body), f"reward server {self.url}")
