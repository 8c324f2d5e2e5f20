"""Pre-flight check of the run directory: it can be made and written here (found before launch, not as a
traceback from the first mkdir or write)."""

from __future__ import annotations

import os
from pathlib import Path

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig

KERNEL_FILE_SYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))
AUTO_NAME_SUFFIX = len("-20260101-120000-9999")  # what rundir.create appends to run.name


def run_dir_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """The run directory can be made and written here: run.dir, or under run.root an auto-named one from run.name
    (found before launch, not as a traceback from the first mkdir or write)."""
    hint = "pick a directory this user can write, e.g. run.dir=runs/mine"
    if cfg.run.dir:
        problem = directory_problem(cfg.run.dir)
        return [ConfigError("run.dir", cfg.run.dir, problem, hint)] if problem else []
    problem = directory_problem(cfg.run.root)
    if problem:
        return [ConfigError("run.root", cfg.run.root, problem, hint.replace("run.dir=", "run.root="))]
    name = cfg.run.name
    leaf = name.rsplit("/", 1)[-1]
    if "\0" in name or not leaf or leaf in (".", "..") or len(leaf.encode()) + AUTO_NAME_SUFFIX > NAME_MAX:
        return [ConfigError("run.name", name, f"cannot name a directory (at most {NAME_MAX - AUTO_NAME_SUFFIX} "
                            "bytes after the last '/', no NUL, not empty, not . or ..)")]
    parent = Path(cfg.run.root).expanduser() / name  # a name with '/' (or an absolute one) picks another parent
    problem = directory_problem(str(parent.parent)) if "/" in name else None
    return [ConfigError("run.name", name, f"the run directory's parent {parent.parent}: {problem}")] if problem else []


NAME_MAX = 255  # bytes in one path component, on every file system slimecli runs on


def directory_problem(value: str) -> str | None:
    """None when ``value`` is a directory this process can write, or one it can create; else why not."""
    try:
        path = Path(value).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # ~nosuchuser, a symlink loop, a NUL byte
        return f"not a usable path ({exc})"
    for kernel in KERNEL_FILE_SYSTEMS:
        if path == kernel or kernel in path.parents:
            return f"is under {kernel}, a kernel file system, not a place for run files"
    if any(len(part.encode()) > NAME_MAX for part in path.parts):
        return f"a path component is longer than {NAME_MAX} bytes"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return ("exists and is a file, not a directory" if existing == path else
                f"{existing} is a file, so no directory can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK) or os.statvfs(existing).f_flag & os.ST_RDONLY:
        return "the directory is not writable here" if existing == path else f"cannot create it: {existing} is not writable"
    return None
