"""One sandbox from the config: `auto` is bwrap where it starts, else local with one warning."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.config.registry import SANDBOXES
from slimecli.sandbox.base import Sandbox

log = logging.getLogger(__name__)
LOCAL_GAPS = ("the agent can read and write every file this user can (run directories, caches, the project), "
              "reach every loopback port (engine, teacher, reward server), signal this user's processes and "
              "leave processes behind")
_warned = False


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot run on this machine."""


def resolve_kind(settings: SandboxConfig) -> str:
    """The kind that will run: `auto` decided once per process."""
    global _warned
    if settings.name != "auto":
        return settings.name
    from slimecli.sandbox.bwrap import available

    why = available()
    if why is None:
        return "bwrap"
    if not _warned:
        log.warning("sandbox=auto: %s; using sandbox=local, which does not isolate: %s", why, LOCAL_GAPS)
        _warned = True
    return "local"


def unavailable(settings: SandboxConfig) -> str | None:
    """Why the configured sandbox kind cannot run on this machine, or None (auto always can: local is its floor)."""
    if settings.name == "auto":
        return None
    entry = SANDBOXES.get(settings.name)
    return cast(str | None, entry.obj.unavailable(settings, **entry.options))


def make_sandbox(settings: SandboxConfig, workdir: str | Path | None = None, *, allow_ports: Sequence[int] = (),
                 ro_paths: Sequence[str | Path] = (), path_dirs: Sequence[str] = (),
                 image: str | None = None) -> Sandbox:
    """A sandbox of the kind the settings name (one of the registry's, slimecli.config.registry.SANDBOXES)."""
    kind = resolve_kind(settings)
    entry = SANDBOXES.get(kind)
    cls: type[Sandbox] = entry.obj
    why = cls.unavailable(settings, **entry.options)
    if why is not None:
        raise SandboxUnavailable(f"sandbox={kind}: {why}")
    kwargs: dict[str, Any] = {"allow_ports": allow_ports, "settings": settings, "ro_paths": ro_paths,
                              "path_dirs": path_dirs, **entry.options}
    if cls.runs_images:
        kwargs["image"] = image or settings.image
    return cls(workdir, **kwargs)


def grader_factory(settings: SandboxConfig, *, path_dirs: Sequence[str] | None = None,
                   ro_paths: Sequence[str | Path] = (), image: str | None = None) -> Callable[[Path], Sandbox]:
    """Fresh sandboxes for graders and task checks: no ports, nothing but the workspace and `ro_paths`, and
    `path_dirs` first on PATH (default: this interpreter's directory, whose environment has the test runner)."""
    dirs = tuple(path_dirs) if path_dirs is not None else (str(Path(sys.executable).parent),)
    return lambda workdir: make_sandbox(settings, workdir, path_dirs=dirs, ro_paths=ro_paths, image=image)
