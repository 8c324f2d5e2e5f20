"""One process serving an agent back-end: the rollout engine (started here or reached by URL), the
trajectory manager, and the adapter HTTP server the CLI talks to."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from aiohttp import web

from slimecli.agent.api.adapter import Adapter, AdapterSettings
from slimecli.agent.api.engine_link import EngineLink, EnginePool
from slimecli.agent.api.render import Renderer
from slimecli.agent.registry import resolve
from slimecli.agent.trajectory.manager import TrajectoryManager
from slimecli.model.tool_calls import get_parser
from slimecli.net.listen import READ_TIMEOUT_S, app_runner, start_site
from slimecli.net.ports import free_port
from slimecli.net.probe import poll_delays

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig
    from slimecli.process import Started

log = logging.getLogger(__name__)
Spawn = Callable[[list[str], IO[bytes]], "Started | None"]  # starts `python -m slimecli.engine ...`, output to IO
ENGINE_POLL_S = 0.1  # the most wait_engine waits between two looks


class EngineProcess:
    """The embedded engine (`python -m slimecli.engine --config FILE`) as a child process. Its frozen config and
    log live in a temporary directory of its own, removed once it is stopped (a failure quotes the log's tail)."""

    def __init__(self, cfg: SlimeConfig) -> None:
        from slimecli.config.io import save_frozen

        port = free_port(cfg.rollout.host)
        self.cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, port=port, num_engines=1))
        self.url = f"http://{cfg.rollout.host}:{port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="slimecli-engine-"))
        self.config_path = save_frozen(self.cfg, self.workdir / "config.yaml")
        self.log_path = self.workdir / "engine.log"
        self.proc: subprocess.Popen | Started | None = None

    def start(self, spawn: Spawn | None = None) -> None:
        """`spawn(argv, log)`: how the command starts it (`slimecli agent run` forks it from itself, once it has
        imported the engine's modules: launch/forked.py, fork_from_here); None, or where it cannot: Popen."""
        argv = [sys.executable, "-m", "slimecli.engine", "--config", str(self.config_path)]
        log_file = self.log_path.open("ab")
        self.proc = (spawn(argv, log_file) if spawn is not None else None) or subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)  # a command that exits before its service's stop() (a failure, Ctrl-C)

    def failed(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            return f"engine exited with {self.proc.returncode}:\n{tail}"
        return None

    def stop(self) -> None:
        from slimecli.process import kill_group

        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc.pid, grace_s=5.0, leader=self.proc)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


async def wait_engine(healthy: Callable[[], Awaitable[bool]], url: str, timeout_s: float,
                      proc: EngineProcess | None = None) -> None:
    """Poll `healthy` until it answers; RuntimeError when `proc` (the engine started here) exits first, with its
    log's tail, or after timeout_s. `agent run` waits on nothing else: polled every 0.1 s at most (a loopback GET),
    its engine is seen 0.05 s after it is ready on average, not 0.25 s."""
    deadline = time.monotonic() + timeout_s
    delays = poll_delays(ENGINE_POLL_S)
    while time.monotonic() < deadline:
        if proc is not None and (reason := proc.failed()):
            raise RuntimeError(reason)
        if await healthy():
            return
        await asyncio.sleep(next(delays))
    raise RuntimeError(f"rollout engine at {url} not ready after {timeout_s:.0f}s")


async def serve_app(app: web.Application, host: str, port: int, read_timeout_s: float = READ_TIMEOUT_S
                    ) -> web.AppRunner:
    """Serve an adapter's app: handler cancellation (a client gone mid-turn aborts its engine request), a
    connection that stalls in its request head is closed after read_timeout_s, and open connections are capped
    (slimecli.net.listen)."""
    runner = app_runner(app, read_timeout_s=read_timeout_s)
    await runner.setup()
    await start_site(runner, host, port)
    return runner


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def dial_url(host: str, port: int, advertise_host: str | None = None) -> str:
    """The URL the CLIs are given: agent.advertise_host, else the bind address unless it is a wildcard."""
    name = advertise_host or ("127.0.0.1" if host in WILDCARD_HOSTS else host)
    return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"


class AgentService:
    def __init__(self, cfg: SlimeConfig, port: int | None = None, engine_urls: list[str] | None = None,
                 spawn: Spawn | None = None) -> None:
        """`engine_urls`: managed engines to share (training: every rollout engine), sessions sticky to one;
        without them, the service starts its own engine (`spawn`: EngineProcess.start)."""
        from slimecli.model.loading import resolve_model_path

        self.cfg = cfg
        agent = cfg.agent
        self.name, self.harness_cls, adapter_cls = resolve(agent.name, agent.harness, agent.adapter)
        if cfg.model.path is None and cfg.model.name == "tiny":
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(resolve_model_path(cfg.model))))
            self.cfg = cfg
        urls = list(engine_urls or ([agent.engine_url] if agent.engine_url else []))
        self.engine_proc = None if urls else EngineProcess(cfg)
        if self.engine_proc is not None:
            urls = [self.engine_proc.url]
            self.engine_proc.start(spawn)
        try:
            self._set_up(cfg, urls, adapter_cls, port)
        except BaseException:
            self.close_engine()
            raise

    def _set_up(self, cfg: SlimeConfig, urls: list[str], adapter_cls: Callable[..., Adapter], port: int | None) -> None:
        """The tokenizer, the trajectories, the engine link and the adapter (beside the engine starting)."""
        from slimecli.model.loading import resolve_tokenizer_path

        agent = cfg.agent
        self.renderer = Renderer.from_path(resolve_tokenizer_path(cfg.model), agent.max_context_len)
        self.manager = TrajectoryManager(self.renderer.stop_ids, self.renderer.decode_all, agent.max_turns,
                                         agent.realign_min_ratio)
        self.engine: EngineLink | EnginePool = (EngineLink(urls[0], cfg.rollout.request_timeout_s, cfg.rollout.api_key)
                                                if len(urls) == 1 else
                                                EnginePool(urls, cfg.rollout.request_timeout_s, cfg.rollout.api_key))
        settings = AdapterSettings(agent, cfg.rollout, model_name=Path(cfg.model.path or cfg.model.name).name)
        self.adapter: Adapter = adapter_cls(self.renderer, self.engine, self.manager, get_parser(agent.tool_parser),
                                            settings)
        self.host = agent.host
        self.boots = asyncio.Semaphore(max(1, cfg.sandbox.max_concurrent_boots))  # sandboxes created at once
        # 0 (agent.port=auto): any free port, known once it listens (start)
        self.port: int = (agent.port if isinstance(agent.port, int) else 0) if port is None else port
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return dial_url(self.host, self.port, self.cfg.agent.advertise_host)

    def close_engine(self) -> None:
        """Stop the engine started here, if any (idempotent)."""
        if self.engine_proc is not None:
            self.engine_proc.stop()

    async def start(self) -> None:
        try:
            await wait_engine(self.engine.healthy, self.engine.base_url, self.cfg.rollout.start_timeout_s,
                              self.engine_proc)
        except BaseException:
            await asyncio.to_thread(self.close_engine)  # not left running by a start that failed
            raise
        self._runner = await serve_app(self.adapter.app(), self.host, self.port)
        if self.port == 0:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.engine.close()
        if self.engine_proc is not None:
            await asyncio.to_thread(self.engine_proc.stop)
