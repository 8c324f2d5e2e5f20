"""What the route modules (weights, disk_update, adapters, loads) need of the engine server: its state, seen through
a Protocol, and the helpers they share. The server implements it; the routes depend on this module only, so
no route module imports the server, and the server imports its routes without an import circle."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from aiohttp import web
    from aiohttp.typedefs import Handler, Middleware

    from slimecli.engine.scheduler import Scheduler

# What the scheduler thread runs between two steps to change the served weights; it is given the served model
# (a transformers model: untyped).
Install = Callable[[Any], None]


class Adapters(Protocol):
    def forget(self) -> None: ...


class WeightState(Protocol):
    """What a disk update must know of the other weight routes: whether the served tensors are views of a
    shared segment, and the LoRA adapters to forget when whole weights replace them."""

    @property
    def segment(self) -> object | None: ...

    @property
    def lora(self) -> Adapters: ...


class EngineCore(Protocol):
    """The engine server's state that its routes read: the scheduler (after readiness let a request through),
    the update lock that keeps weight updates one at a time, and the settings it was built with."""

    model_path: str
    dtype: str
    device: str
    scheduler: Scheduler | None  # None until load() started it
    max_running: int
    context_length: int
    config: Any  # the served model's text config (after load())
    vocab_size: int
    same_config: tuple[bytes, Any] | None
    weight_roots: list[str | Path] | None
    loopback_loads_anywhere: bool
    _update_lock: asyncio.Lock

    @property
    def weight_routes(self) -> WeightState: ...

    @property
    def _sched(self) -> Scheduler: ...

    def _not_ready(self) -> web.Response | None: ...


def readiness(core: EngineCore, always_open: Collection[str]) -> Middleware:
    """The aiohttp middleware that answers 503 (the engine is starting, or its scheduler stopped) for every route
    but `always_open`, before the handler reads a byte of the body; an unknown path stays a 404."""
    from aiohttp import web

    @web.middleware
    async def ready(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.http_exception is None and request.path not in always_open:
            if (resp := core._not_ready()) is not None:
                return resp
        return await handler(request)
    return ready


def roots(core: EngineCore, request: web.Request) -> list[str | Path] | None:
    """Where a request may load weights from: None (anywhere) for a client on this host when no roots were
    configured; else the roots (rollout.weight_roots)."""
    if core.loopback_loads_anywhere and is_loopback(request.remote):
        return None
    return core.weight_roots


def is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:  # a Unix socket, or no peer address
        return False


def installer(targets: dict[str, torch.Tensor], sources: dict[str, torch.Tensor], bind: bool = False) -> Install:
    """What the scheduler thread runs: each served tensor gets its source's values.

    ``bind``: where dtype and device agree, the served tensor becomes the source itself (a view of a shared
    segment the trainer writes into while the engine is paused), so later updates copy nothing here.
    """
    import torch

    def install(_model: Any) -> None:
        with torch.no_grad():
            for name, src in sources.items():
                target = targets[name]
                if target.data_ptr() == src.data_ptr():
                    continue  # already served from the segment: the trainer wrote the new values in place
                if bind and target.dtype == src.dtype and target.device == src.device:
                    target.data = src
                else:
                    target.copy_(src)
    return install
