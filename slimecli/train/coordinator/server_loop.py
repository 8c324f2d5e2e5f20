"""The event loop rank 0 talks to the servers from, on a thread of its own: rollouts, weight deliveries and
evaluations run there while the trainer's thread computes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TypeVar

_T = TypeVar("_T")


class ServerLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rollout-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[_T]) -> Future[_T]:
        """Start ``coro`` on the loop; its Future, for the trainer's thread."""
        async def wrapped() -> _T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop)

    def run(self, coro: Awaitable[_T]) -> _T:
        """Run ``coro`` on the loop and wait for its result (never from the loop's own thread)."""
        return self.submit(coro).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
