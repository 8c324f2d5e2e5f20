"""Start an engine: bind the port, load the model, warm up, print the readiness line, serve until signalled."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from slimecli.engine import server as server_mod
from slimecli.engine.server import EngineServer, default_device
from slimecli.net.listen import MAX_CONNECTIONS, app_runner, start_site


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
    await start_site(runner, server.host, server.port, max_connections=server.max_connections)
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
        except Exception as exc:  # noqa: BLE001 - say what failed, exit non-zero
            raise EngineStartError(f"cannot load the model from {server.model_path}: {type(exc).__name__}: {exc}"
                                   ) from exc
        await server.warm_up()
        server.ready = True
        assert server.scheduler is not None  # load() started it
        print(READY_LINE.format(host=server.host, port=server.port, model=server.model_path,
                                version=server.scheduler.weight_version), flush=True)
        await stop.wait()
    finally:
        if server.scheduler is not None:
            server.scheduler.stop()
        await runner.cleanup()


def run(model_path: str | Path, *, host: str, port: int, tokenizer_path: str | Path | None = None,
        dtype: str = "float32", max_running: int = 64, seed: int | None = None, device: str = "auto",
        prefix_cache_mb: int | None = None, trust_remote_code: bool = False, log_level: str = "info",
        api_key: str | None = None, weight_roots: list[str | Path] | None = None, read_timeout_s: float = 60.0,
        max_connections: int = MAX_CONNECTIONS, loopback_loads_anywhere: bool = False) -> None:
    """Serve until signalled; the keyword settings are the run config's (rollout.device, rollout.prefix_cache_mb,
    model.trust_remote_code, run.log_level, rollout.api_key, rollout.weight_roots, rollout.read_timeout_s,
    rollout.max_connections) and hold for this whole process, weight updates included."""
    from slimecli.model.loading import set_trust_remote_code

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    server_mod.PREFIX_CACHE_MB = prefix_cache_mb
    set_trust_remote_code(trust_remote_code)
    server = EngineServer(model_path, tokenizer_path=tokenizer_path, dtype=dtype, max_running=max_running,
                          host=host, port=port, seed=seed, device=default_device(device), api_key=api_key,
                          weight_roots=weight_roots, read_timeout_s=read_timeout_s, max_connections=max_connections,
                          loopback_loads_anywhere=loopback_loads_anywhere)
    try:
        asyncio.run(serve(server))
    except EngineStartError as exc:
        print(f"slimecli engine: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as exc:
        print(f"slimecli engine: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
