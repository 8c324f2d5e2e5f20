"""What the `... serve` commands (rollout, teacher, agent) share: the config they serve, with the run named after
the command, its "auto" ports picked and the command's pre-flight passed (every error at once, exit 2); the run
directory that records it; and running until Ctrl-C or SIGTERM, with every `finally` run."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from slimecli.cli.common import fail

if TYPE_CHECKING:
    from slimecli.config.errors import ConfigError
    from slimecli.config.schema import SlimeConfig
    from slimecli.launch.rundir import RunDir

T = TypeVar("T")


def served_config(cfg: SlimeConfig, overrides: list[str], preflight: Callable[[SlimeConfig], list[ConfigError]], *,
                  name: str | None = None,
                  ports: Callable[[SlimeConfig], SlimeConfig] | None = None) -> SlimeConfig:
    """`cfg` as the command serves it: run.name `name` unless the command line names the run, `ports` picked
    (launch/free_ports.py), and `preflight` passed; exit 2 with the errors otherwise."""
    from dataclasses import replace

    from slimecli.config.errors import ConfigErrors

    if name is not None and not any(o.startswith(("run.name=", "run.dir=")) for o in overrides):
        cfg = replace(cfg, run=replace(cfg.run, name=name))
    try:
        cfg = ports(cfg) if ports is not None else cfg
    except ConfigErrors as exc:  # a port left "auto" that cannot be picked on this host
        fail(exc.render())
    errors = preflight(cfg)
    if errors:
        fail(ConfigErrors(errors).render())
    return cfg


def run_dir_or_exit(cfg: SlimeConfig, overrides: list[str]) -> RunDir:
    """The run directory holding the resolved config the server serves, for the record; exit 2 when it is in use
    by a live command or holds another run."""
    import sys

    from slimecli.config.errors import ConfigErrors
    from slimecli.launch.rundir import prepare

    try:
        return prepare(cfg, sys.argv, overrides)
    except ConfigErrors as exc:
        fail(exc.render())


def run_until_signal(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, with SIGTERM / SIGINT cancelling the main task so every `finally` (engine, CLI) runs;
    KeyboardInterrupt when it was cancelled."""
    import asyncio
    import signal

    async def main() -> T:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None

    return asyncio.run(main())
