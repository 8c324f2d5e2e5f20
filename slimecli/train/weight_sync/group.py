"""``trainer.weight_sync=nccl``: SGLang's weight-update group; every tensor is broadcast from rank 0 to every
engine rank, in buckets of ``trainer.weight_sync_bucket_mb``. NCCL when the trainer has a GPU; gloo otherwise
(the same protocol, which is how it is tested on a CPU). Each engine sees pause -> flush -> begin -> the
buckets -> end -> continue."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import torch

from slimecli.net.ports import free_port
from slimecli.train.weight_sync.base import Runner, _check, _gather, _ready

log = logging.getLogger("slimecli.train")
GROUP_NAME = "slimecli_weight_update"


class GroupSync:
    """Rank 0 of SGLang's weight-update group; every engine rank joins it at the first push. The group takes no new
    member mid-run: an engine that dies stops the run (launch/plan.py gives engines no restarts here)."""

    def __init__(self, engines: list[Any], run: Runner, *, bucket_bytes: int, timeout_s: float) -> None:
        self.engines, self.run = engines, run
        self.bucket_bytes, self.timeout_s = max(1, bucket_bytes), timeout_s
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        self.group: Any = None
        self.broken: str | None = None  # why the group can carry no more updates (a broadcast was abandoned)

    def _join(self) -> None:
        from slimecli.engine.weight_transfer import init_weight_group

        async def sizes() -> list[int]:
            infos = await asyncio.gather(*(e.get_server_info() for e in self.engines))
            return [int(info.get("tp_size", 1) or 1) for info in infos]

        tp = self.run(sizes())
        world = 1 + sum(tp)
        host = _address_towards(self.engines[0].base_url)
        port = free_port(host)
        offsets = [1 + sum(tp[:i]) for i in range(len(tp))]

        async def join_all() -> Any:
            mine = asyncio.to_thread(init_weight_group, self.backend, host, port, world, 0, GROUP_NAME,
                                     self.timeout_s)
            theirs = [e.init_weights_update_group(host, port, off, world, GROUP_NAME, self.backend)
                      for e, off in zip(self.engines, offsets, strict=True)]
            group, *results = await asyncio.gather(mine, *theirs)
            for engine, result in zip(self.engines, results, strict=True):
                _check(engine, result, f"group {GROUP_NAME}")
            return group

        self.group = self.run(join_all())
        log.info("weight-update group %s: rank 0 of %d on %s:%d (%s)", GROUP_NAME, world, host, port, self.backend)

    def begin_push(self, state: dict[str, torch.Tensor], version: int,
                   engines_free: Callable[[], None] = _ready) -> tuple[str, Awaitable[None] | None]:
        return self.push(state, version, engines_free), None  # a collective with every engine

    def push(self, state: dict[str, torch.Tensor], version: int, engines_free: Callable[[], None] = _ready) -> str:
        import torch.distributed as dist

        from slimecli.engine.weight_transfer import dtype_name

        engines_free()
        from slimecli.checkpoint.tensors import split_shared

        if self.group is None:
            self._join()
        tensors, _aliases = split_shared(state)

        def send(bucket: list[tuple[str, torch.Tensor]]) -> None:
            for _name, t in bucket:
                dist.broadcast(t if self.device is None else t.to(self.device), src=0, group=self.group)

        async def one_bucket(bucket: list[tuple[str, torch.Tensor]], last: bool) -> None:
            names = [n for n, _ in bucket]
            dtypes = [dtype_name(t.dtype) for _, t in bucket]
            shapes = [list(t.shape) for _, t in bucket]
            posts = [e.update_weights_from_distributed(names, dtypes, shapes, GROUP_NAME, str(version),
                                                       flush_cache=last)  # the cache goes once, after the last
                     for e in self.engines]
            await _broadcast_while_engines_receive(_in_daemon_thread(send, bucket), posts, self.engines,
                                                   f"by broadcast (version {version})")

        async def update_all() -> None:
            await asyncio.gather(*(e.pause() for e in self.engines))
            try:
                await asyncio.gather(*(e.flush_cache() for e in self.engines if not e.keeps_requests))
                opened = await asyncio.gather(*(e.begin_weight_update() for e in self.engines))
                try:
                    buckets = list(_buckets(tensors, self.bucket_bytes))
                    for i, bucket in enumerate(buckets):
                        await one_bucket(bucket, last=i == len(buckets) - 1)
                finally:
                    await asyncio.gather(*(e.end_weight_update() for e, o in zip(self.engines, opened, strict=True)
                                           if o), return_exceptions=True)
            finally:
                await asyncio.gather(*(e.resume() for e in self.engines), return_exceptions=True)

        if self.broken is not None:
            raise RuntimeError(f"the weight-update group is unusable after an earlier failure: {self.broken}")
        try:
            self.run(update_all())
        except Exception as exc:
            self.broken = str(exc)
            raise
        return f"group {GROUP_NAME}"

    async def resync(self, engine: Any) -> bool:
        raise RuntimeError(f"engine {engine.base_url} was restarted, but trainer.weight_sync=nccl cannot give one "
                           "engine the weights again (its weight-update group takes no new member)")

    def before_update(self) -> None:
        pass

    def close(self) -> None:
        if self.group is None:
            return
        from slimecli.engine.weight_transfer import destroy_weight_group

        self.run(_gather((e.destroy_weights_update_group(GROUP_NAME) for e in self.engines),
                         return_exceptions=True))
        if self.broken is None:  # else a broadcast may still block on it: the process's exit takes it down
            destroy_weight_group(self.group)
        self.group = None


def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """fn(*args) in a daemon thread: a broadcast that no engine joins blocks it until the group's timeout, and a
    thread of the default executor would then hold up the interpreter's exit."""
    import threading

    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, exc = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, exc = None, e
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=target, name="weight-broadcast", daemon=True).start()
    return future


async def _broadcast_while_engines_receive(sent: asyncio.Future[Any], posts: list[Awaitable[dict[str, Any]]],
                                           engines: list[Any], what: str) -> None:
    """Rank 0's broadcast completes only once every engine receives: an engine that answers success=false (or
    fails) before it does has left the collective, so stop waiting on it and say which engine and why."""
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(p) for p in posts]
    pending: set[asyncio.Future[Any]] = {sent, *tasks}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is sent:
                    task.result()  # a failed broadcast raises here
                    continue
                engine = engines[tasks.index(task)]
                try:
                    _check(engine, task.result(), what)
                except Exception as exc:
                    if sent.done():
                        raise
                    raise RuntimeError(f"{exc}; rank 0's broadcast cannot complete without this engine, so the "
                                       "update is abandoned (the weight-update group carries no more updates: "
                                       "restart the run)") from exc
    finally:
        for task in tasks:
            task.cancel()


def _buckets(tensors: dict[str, torch.Tensor], limit: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if bucket and size + n > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def _address_towards(url: str) -> str:
    """This host's address on the route to the engine (what the engine can reach us at)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the outgoing interface
        return str(s.getsockname()[0])
