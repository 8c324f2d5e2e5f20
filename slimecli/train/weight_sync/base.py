"""What every way of handing weights to the engines shares: the WeightSync protocol rank 0 drives, the runner
of rank 0's event loop, and the checks of the engines' replies. Its own module so that the kinds and the
factory that picks one (the package's __init__) import it, not each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import torch


def _ready() -> None:
    pass


class WeightSync(Protocol):
    def push(self, state: dict[str, torch.Tensor], version: int, engines_free: Callable[[], None] = _ready) -> str:
        """Give every engine these weights as ``version``; returns where they went (for the log).
        ``engines_free`` is called before any engine is touched and returns once the engines may take new
        weights (trainer.async_rollout: the rollout generated ahead is in); work of the trainer's own comes
        before it, so it overlaps that rollout."""
        ...

    def begin_push(self, state: dict[str, torch.Tensor], version: int,
                   engines_free: Callable[[], None] = _ready) -> tuple[str, Awaitable[None] | None]:
        """push, but what only waits on the engines comes back as a coroutine the caller may run after it moves
        on (None: the push is complete). A disk push has such a part; kinds that read the trainer's memory or
        take part in a collective finish here."""
        ...

    def before_update(self) -> None:
        """Called before the optimizer changes the trainer's weights."""
        ...

    async def resync(self, engine: Any) -> bool:
        """Give one engine, restarted by the supervisor, the weights last pushed, as their version (on rank 0's
        event loop). False: nothing was pushed yet (the engine's own weights are the run's)."""
        ...

    def close(self) -> None: ...


Runner = Callable[[Awaitable[Any]], Any]  # runs a coroutine on rank 0's event loop


class DeferredDelivery:
    """A kind whose engines' part comes back from begin_push as a coroutine; push runs that part at once."""

    run: Runner

    def begin_push(self, state: dict[str, torch.Tensor], version: int,
                   engines_free: Callable[[], None] = _ready) -> tuple[str, Awaitable[None]]:
        raise NotImplementedError

    def push(self, state: dict[str, torch.Tensor], version: int, engines_free: Callable[[], None] = _ready) -> str:
        path, delivery = self.begin_push(state, version, engines_free)
        self.run(delivery)
        return path


def _check(engine: Any, result: dict[str, Any], what: str) -> None:
    if not result.get("success", False):
        why = result.get("message") or result.get("error_message")  # SGLang's LoRA replies say error_message
        raise RuntimeError(f"engine {engine.base_url} refused weights {what}: {why}")


async def _gather(aws: Iterable[Awaitable[Any]], return_exceptions: bool = False) -> list[Any]:
    """gather() inside a coroutine, so it binds to the loop that runs it."""
    return list(await asyncio.gather(*aws, return_exceptions=return_exceptions))
