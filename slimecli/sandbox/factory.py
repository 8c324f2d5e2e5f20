"""One sandbox from the config. `auto` is the first kind that starts here (auto.py) and never `local`: where
none starts it is refused. `local` runs without isolation only when named, and says so (`notice`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from slimecli.config.groups.sandbox import LOCAL_GAPS, SandboxConfig
from slimecli.config.registry import SANDBOXES
from slimecli.sandbox.auto import AUTO_HINT, INSTALL_BWRAP, choose
from slimecli.sandbox.base import Sandbox

log = logging.getLogger(__name__)
_said_local = False


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot run on this machine."""


def resolve_kind(settings: SandboxConfig) -> str:
    """The kind that will run: `auto` decided once per process (SandboxUnavailable where nothing starts)."""
    if settings.name != "auto":
        return settings.name
    choice = choose(settings)
    if choice.kind is None:
        raise SandboxUnavailable(f"{choice.describe()}; {AUTO_HINT}")
    return choice.kind


def unavailable(settings: SandboxConfig) -> str | None:
    """Why the configured sandbox cannot run on this machine, or None."""
    if settings.name == "auto":
        choice = choose(settings)
        return None if choice.kind is not None else choice.describe()
    entry = SANDBOXES.get(settings.name)
    return cast(str | None, entry.obj.unavailable(settings, **entry.options))


def hint(settings: SandboxConfig) -> str:
    """What to do when `unavailable(settings)` is not None."""
    if settings.name == "auto":
        return AUTO_HINT
    if settings.name == "bwrap":
        return f"{INSTALL_BWRAP}; or choose sandbox=auto (bwrap, else podman or docker)"
    return "install or start it, or choose sandbox=auto"


def local_notice(settings: SandboxConfig) -> str:
    """What a run with sandbox=local says when it starts: what it does not isolate, and the limits that do not hold."""
    from slimecli.sandbox.local import LocalSandbox

    unheld = LocalSandbox.unheld(settings)
    limits = f"; {'; '.join(unheld)}" if unheld else ""
    return f"sandbox=local does not isolate: {LOCAL_GAPS}{limits}"


def notice(settings: SandboxConfig) -> tuple[str, str] | None:
    """(level, text) a command that runs model-written code says when it starts: "warning" with what sandbox=local
    leaves open, "info" with the kind auto picked; None for a kind named explicitly."""
    if settings.name == "local":
        return "warning", local_notice(settings)
    if settings.name == "auto":
        choice = choose(settings)
        return ("warning" if choice.passed_over else "info"), choice.describe()
    return None


def make_sandbox(settings: SandboxConfig, workdir: str | Path | None = None, *, allow_ports: Sequence[int] = (),
                 ro_paths: Sequence[str | Path] = (), path_dirs: Sequence[str] = (),
                 image: str | None = None) -> Sandbox:
    """A sandbox of the kind the settings name (one of the registry's, slimecli.config.registry.SANDBOXES)."""
    global _said_local
    kind = resolve_kind(settings)
    entry = SANDBOXES.get(kind)
    cls: type[Sandbox] = entry.obj
    why = cls.unavailable(settings, **entry.options)
    if why is not None:
        raise SandboxUnavailable(f"sandbox={kind}: {why}")
    if kind == "local" and not _said_local:  # in the log of the process that runs the commands (info: the CLI said it)
        log.info("%s", local_notice(settings))
        _said_local = True
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
