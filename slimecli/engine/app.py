"""Start an engine: bind the port, load the model, warm up, print the readiness line, serve until signalled."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time

from slimecli.engine.server import EngineServer
from slimecli.engine.settings import EngineSettings
from slimecli.net.listen import app_runner, start_site
from slimecli.observe import startup

log = logging.getLogger("slimecli.engine")


class EngineStartError(RuntimeError):
    pass


READY_LINE = "slimecli engine ready on http://{host}:{port} (model {model}, weight_version {version})"


async def serve(server: EngineServer, stop: asyncio.Event | None = None) -> None:
    server.loop = asyncio.get_running_loop()
    # shutdown_timeout: once stopped, the scheduler finishes nothing; requests still open are cut at once, so
    # clients see the engine go (and fail over or stop) instead of waiting out a 60 s graceful shutdown
    runner = app_runner(server.app(), read_timeout_s=server.limits.body_timeout_s, shutdown_timeout=1.0)
    await runner.setup()
    # bound first: /health answers 503 while the model loads
    await start_site(runner, server.host, server.port, max_connections=server.settings.max_connections)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        try:
            await asyncio.to_thread(server.load)
        except Exception as exc:  # say what failed, exit non-zero
            raise EngineStartError(f"cannot load the model from {server.model_path}: {type(exc).__name__}: {exc}"
                                   ) from exc
        startup.mark("model loaded")
        await server.warm_up()
        server.ready = True
        startup.mark("ready")
        assert server.scheduler is not None  # load() started it
        print(READY_LINE.format(host=server.host, port=server.port, model=server.model_path,
                                version=server.scheduler.weight_version), flush=True)
        await stop.wait()
    finally:
        if server.scheduler is not None:
            server.scheduler.stop()
            # what the engine did over its life, for whoever reads its log (bench/bench_async.py: its idle share)
            log.info("engine stats: %s", json.dumps({**server.scheduler.stats,
                                                     "uptime_s": round(time.time() - server.started, 3)}))
        await runner.cleanup()


def run(settings: EngineSettings) -> None:
    """Serve until signalled."""
    from slimecli.model.loading import set_trust_remote_code

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    set_trust_remote_code(settings.trust_remote_code)
    server = EngineServer(settings)
    try:
        asyncio.run(serve(server))
    except EngineStartError as exc:
        print(f"slimecli engine: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as exc:
        print(f"slimecli engine: cannot serve on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
