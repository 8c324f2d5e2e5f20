"""The engine's generation controls, SGLang's: /abort_request, /pause_generation, /continue_generation and
/flush_cache. Their bodies are decoded by slimecli.engine.bodies (what each field does, or why it is ignored)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from slimecli.config.decode import finite
from slimecli.engine.bodies import (
    AbortReq,
    ContinueGenerationReq,
    FlushCacheQuery,
    PauseGenerationReq,
    read_body,
)
from slimecli.engine.core import EngineCore
from slimecli.engine.protocol import BadRequest, parse_body
from slimecli.engine.seq import Seq

FLUSH_POLL_S = 0.05  # how often a /flush_cache?timeout= looks again whether the requests have finished


class ControlRoutes:
    def __init__(self, server: EngineCore) -> None:
        self.server = server

    def add_to(self, router: web.UrlDispatcher) -> None:
        for path, fn in (("/flush_cache", self.flush_cache), ("/pause_generation", self.pause),
                         ("/continue_generation", self.resume)):
            router.add_post(path, fn)
            router.add_get(path, fn)
        router.add_post("/abort_request", self.abort)

    async def abort(self, request: web.Request) -> web.Response:
        body = await read_body(request, AbortReq)
        rid = body.rid
        if rid is None and not body.abort_all:
            raise BadRequest("rid / abort_all: give a rid, or abort_all: true")
        sch = self.server._sched

        def match(s: Seq) -> bool:
            return body.abort_all or s.item.group == rid or s.rid == rid

        n = await asyncio.wrap_future(sch.call(lambda: sch.abort(match, "Aborted by /abort_request.")))
        return web.json_response({"success": True, "num_aborted": n})

    async def pause(self, request: web.Request) -> web.Response:
        body = await read_body(request, PauseGenerationReq, required=False) if request.method == "POST" \
            else PauseGenerationReq()
        sch = self.server._sched
        n = await asyncio.wrap_future(sch.call(lambda: sch.pause(body.mode)))
        return web.json_response({"success": True, "message": f"Generation paused ({body.mode}).",
                                  "num_requests": n})

    async def resume(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            await read_body(request, ContinueGenerationReq, required=False)
        sch = self.server._sched
        await asyncio.wrap_future(sch.call(sch.resume))
        return web.json_response({"success": True, "message": "Generation continued."})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """As SGLang's: no body is read; ``?timeout=S`` waits up to S seconds for the requests to finish."""
        query = flush_query(request.query.getall("timeout", []))
        sch = self.server._sched
        deadline = time.monotonic() + query.timeout
        while not await asyncio.wrap_future(sch.call(sch.flush)):
            if time.monotonic() >= deadline:
                return web.json_response({"error": {"message": "Cache not flushed: requests are running or waiting."}},
                                         status=400)
            await asyncio.sleep(min(FLUSH_POLL_S, max(0.0, deadline - time.monotonic())))
        return web.json_response({"success": True, "message": "Cache flushed."})


def flush_query(values: list[str]) -> FlushCacheQuery:
    """/flush_cache's `timeout` query parameter (a number of seconds >= 0, given at most once)."""
    if not values:
        return FlushCacheQuery()
    if len(values) > 1:
        raise BadRequest("timeout: given more than once")
    try:
        number: float | None = float(values[0])
    except ValueError:
        number = None
    if finite(number) is None:
        raise BadRequest(f"timeout: expected a number of seconds (got {values[0][:40]!r})")
    return parse_body(FlushCacheQuery, {"timeout": number})
