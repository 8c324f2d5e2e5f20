"""Serving an aiohttp app with limits on connections: a header/idle read timeout and a cap on open ones.

`app_runner(app, read_timeout_s=...)`: aiohttp closes a connection that has not sent a complete request
head within read_timeout_s of connecting or of its last reply (its keep-alive timer, which partial headers
do not reset); body reads are bounded by the BodyLimits of slimecli.net.server, and what is left of a body
after an early reply is drained for at most read_timeout_s too. `start_site(...)` listens
with at most `max_connections` open connections; one more is answered 503 (JSON) and closed at once, so a
crowd of stalled clients cannot use up the process's file descriptors.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

READ_TIMEOUT_S = 60.0
LINGERING_S = 10.0  # aiohttp's default
MAX_CONNECTIONS = 1024


def app_runner(app: web.Application, *, read_timeout_s: float = READ_TIMEOUT_S, **kw: Any) -> web.AppRunner:
    """An AppRunner with slimecli's defaults (handler cancellation, no access log, the read timeout)."""
    kw.setdefault("handler_cancellation", True)
    kw.setdefault("access_log", None)
    # After a reply sent before the body was read (413, a 408 for a stalled body), aiohttp drains the rest of
    # the body so the client reads the reply, for up to its lingering time (10 s). A client's bytes are waited
    # for at most read_timeout_s anywhere else: the same bound here.
    kw.setdefault("lingering_time", min(LINGERING_S, read_timeout_s))
    return web.AppRunner(app, keepalive_timeout=read_timeout_s, **kw)


class _Refuse(asyncio.Protocol):
    """Answers one connection over the cap with a 503 and closes it."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = json.dumps({"error": {"message": f"too many open connections (at most {self.cap}); retry later"}})
        head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n")
        assert isinstance(transport, asyncio.Transport)
        transport.write((head + body).encode())
        transport.close()


class CappedTCPSite(web.TCPSite):
    """A TCPSite that refuses connections beyond `max_connections` (503, then close)."""

    def __init__(self, runner: web.BaseRunner, host: str | None = None, port: int | None = None, *,
                 max_connections: int = MAX_CONNECTIONS, **kw: Any) -> None:
        super().__init__(runner, host, port, **kw)
        self.max_connections = max_connections

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        cap = self.max_connections

        def factory() -> asyncio.Protocol:
            if len(server.connections) >= cap:
                return _Refuse(cap)
            return server()

        self._server = await asyncio.get_running_loop().create_server(
            factory, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


async def start_site(runner: web.BaseRunner, host: str, port: int, *,
                     max_connections: int = MAX_CONNECTIONS) -> CappedTCPSite:
    site = CappedTCPSite(runner, host, port, max_connections=max_connections)
    await site.start()
    return site
