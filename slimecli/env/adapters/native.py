"""env=native: environments written to slimecli's own protocol (slimecli.env.protocol), named by a built-in name,
an installed package's entry point (group `slimecli.environments`) or an import path, all through the one plugin
registry. The named object is a class or factory: called with env.args, it gives one episode's environment. An
environment that has tasks of its own offers them as ``tasks(split) -> list[dict]``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from slimecli.config.groups.env import EnvConfig
from slimecli.config.registry import ENVIRONMENTS, UnknownPluginError
from slimecli.env.protocol import Environment
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider


class NativeProvider(EnvProvider):
    kind = "native"

    def __init__(self, env_id: str, args: Mapping[str, Any], factory: Any, origin: str) -> None:
        super().__init__(env_id, args)
        self.factory = factory
        self.origin = origin
        self._first: Environment | None = self._make()  # made once here: bad arguments fail at load

    def _make(self) -> Environment:
        try:
            env = self.factory(**self.args)
        except TypeError as exc:
            raise EnvLoadError(f"env.args: {self.env_id} does not take {sorted(self.args)}: {exc}") from exc
        missing = [name for name in ("reset", "step", "close") if not callable(getattr(env, name, None))]
        if missing:
            raise EnvLoadError(f"env.id={self.env_id}: {type(env).__name__} has no {', '.join(missing)} "
                               "(an environment has async reset(task), step(action) and close())")
        not_async = [name for name in ("reset", "step", "close")
                     if not inspect.iscoroutinefunction(getattr(env, name))]
        if not_async:
            raise EnvLoadError(f"env.id={self.env_id}: {type(env).__name__}.{not_async[0]} must be async "
                               "(async def); wrap blocking work in asyncio.to_thread")
        return env

    def tasks(self, split: str = "train") -> list[dict[str, Any]] | None:
        probe = self._first or self._make()
        own = getattr(probe, "tasks", None)
        if not callable(own):
            return None
        rows = own(split) if inspect.signature(own).parameters else own()
        if rows is None:
            return None
        rows = list(rows)
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, Mapping)), None)
        if bad is not None:
            raise EnvLoadError(f"env.id={self.env_id}: tasks()[{bad}] is {type(rows[bad]).__name__}, not a mapping")
        return [dict(row) for row in rows]

    def episode(self) -> Environment:
        if self._first is not None:
            env, self._first = self._first, None
            return env
        return self._make()

    def describe(self) -> str:
        return f"native:{self.env_id} ({self.origin})"


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> NativeProvider:
    try:
        entry = ENVIRONMENTS.get(env_id)
    except UnknownPluginError as exc:
        raise EnvNotFound("native", env_id, ENVIRONMENTS.names()) from exc
    except ValueError as exc:  # an import path that does not load
        raise EnvLoadError(str(exc)) from exc
    origin = ENVIRONMENTS.origin(env_id) or "import path"
    return NativeProvider(env_id, args, entry.obj, origin)


def available() -> list[tuple[str, str]]:
    return [(name, ENVIRONMENTS.origin(name)) for name in ENVIRONMENTS.names()]
