"""The run directory: resolved config, command line, overrides, plan, logs, metrics, checkpoints.

A new auto-named directory is created exclusively (two commands started in the same second get two);
every command that runs in one holds its lock (launch/lock.py); a resume may change only what keeps
the run meaningful unless run.resume=force.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimecli.config.convert import is_resumable, to_plain
from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.io import dump_yaml, load_frozen, save_frozen
from slimecli.config.layout import node_dir
from slimecli.config.port import is_port_key
from slimecli.config.schema import SlimeConfig
from slimecli.launch.lock import RunInUse, RunLock, acquire
from slimecli.launch.plan import CONFIG_FILE
from slimecli.launch.spec import ProcessSpec


@dataclass(frozen=True)
class RunDir:
    path: Path
    resumed: bool
    changed: list[str]  # "key: old -> new" for each config key that differs from the stored config of a resume
    lock: RunLock | None = None

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def log_dir(self) -> Path:
        return self.path / "logs"




def default_path(cfg: SlimeConfig) -> Path:
    """The run directory a command would use (for an auto-named one: the name it would try first)."""
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser()
    return Path(cfg.run.root).expanduser() / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def create(cfg: SlimeConfig) -> Path:
    """The run directory, made: run.dir (kept if it exists), or a new auto-named one."""
    if cfg.run.dir:
        path = default_path(cfg).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return _create_auto_named(default_path(cfg).resolve())


def _create_auto_named(first: Path) -> Path:
    """`first`, or `first-2`, `first-3`, ...: whichever this process creates (mkdir is atomic)."""
    first.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = first if n == 1 else first.with_name(f"{first.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory name next to {first}")


def _diff(old: object, new: object, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):  # teachers.1.port
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in _diff(a, b, f"{prefix}.{i}")]
    return [(prefix, old, new)] if old != new else []


def stored_config(overrides: list[str]) -> dict[str, Any] | None:
    """The stored config (plain data) of the run the command line's run.dir names, where one is there: this node's
    own copy (RUN/nodes/<rank>/config.yaml, cluster.node_rank > 0), else RUN/config.yaml. ConfigErrors when it
    cannot be read."""
    from slimecli.config.resume import override_value

    run_dir = override_value(overrides, "run.dir")
    if not run_dir or "${" in run_dir:
        return None
    rank = override_value(overrides, "cluster.node_rank")
    root = Path(run_dir).expanduser()
    candidates = [node_dir(root, int(rank)) / CONFIG_FILE] if rank and rank.isdigit() and int(rank) > 0 else []
    for path in [*candidates, root / CONFIG_FILE]:
        if path.is_file():
            data: dict[str, Any] = to_plain(load_frozen(path))
            return data
    return None


def config_changes(old: SlimeConfig, new: SlimeConfig, overrides: list[str]) -> list[tuple[str, str]]:
    """(key, "key: old -> new") for each key a resume changes. Not run.dir: the stored config was found in the
    directory being resumed, whatever it says (null for an auto-named run, a path relative to another working
    directory, where the directory was before it was moved); nor its ports (where the servers listen is picked
    afresh by each start) or what a command says of itself (run.resume, observe.verbose)."""
    from slimecli.config.compose import AGENT_ENV
    from slimecli.config.resume import PER_COMMAND

    out = []
    for key, a, b in _diff(to_plain(old), to_plain(new)):
        if key == "run.dir" or key in PER_COMMAND or is_port_key(key):
            continue
        line = f"{key}: {a!r} -> {b!r}"
        if key == "agent.name" and os.environ.get(AGENT_ENV) == b and not any(
                o.partition("=")[0].lstrip("+") == "agent" for o in overrides):
            line += f" (from {AGENT_ENV}={b})"
        out.append((key, line))
    return out


def resumable(key: str) -> bool:
    """What a resume may change without run.resume=force: the schema's field specs say (see SlimeConfig)."""
    return is_resumable(SlimeConfig, key)


def resume_command(path: Path, overrides: list[str], then: list[str] | tuple[str, ...] = ()) -> str:
    """The command that resumes the run in ``path``: run.dir naming it absolutely (the run keeps its own stored
    settings, config/resume.py), this node's cluster.* overrides (a node of a multi-node run is told which it is),
    then ``then``. The program as this one was started, so that it runs as printed (`.venv/bin/slimecli` when
    that is not the `slimecli` on PATH)."""
    def key(override: str) -> str:
        return override.partition("=")[0].lstrip("+~")

    replaced = set(map(key, then))
    kept = [o for o in overrides if key(o).startswith("cluster.") and key(o) not in replaced]
    return shlex.join([*program(), "train", *kept, *then, f"run.dir={path.resolve()}"])


def program(argv0: str | None = None) -> list[str]:
    """How to run slimecli again: `slimecli` where that is on PATH (or this process was not started as the
    console script), else the script's path as it was typed (`.venv/bin/slimecli`)."""
    import shutil
    import sys

    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).name != "slimecli" or "/" not in argv0:
        return ["slimecli"]
    on_path = shutil.which("slimecli")
    try:
        if on_path is not None and Path(on_path).samefile(argv0):
            return ["slimecli"]
    except OSError:
        pass
    return [argv0]


def prepare(cfg: SlimeConfig, argv: list[str], overrides: list[str]) -> RunDir:
    """Create (or reopen, as a resume) the run directory, lock it, and write the frozen config into it.

    ConfigErrors when the directory is in use by a live command, or when a resume changes what it may not.
    """
    path = node_dir(create(cfg), cfg.cluster.node_rank)  # node ranks > 0 keep their own files in RUN/nodes/<rank>
    path.mkdir(parents=True, exist_ok=True)
    try:
        lock = acquire(path, shlex.join(argv))
    except RunInUse as exc:
        raise ConfigErrors([ConfigError("run.dir", str(path), str(exc))]) from None
    config_path = path / CONFIG_FILE
    resumed = config_path.is_file()
    changed: list[str] = []
    if resumed:
        old = load_frozen(config_path)
        diff = config_changes(old, cfg, overrides)
        refused = [line for key, line in diff if not resumable(key)]
        if refused and cfg.run.resume != "force":
            lock.release()
            raise ConfigErrors([ConfigError(
                "run.resume", cfg.run.resume,
                f"{path} holds a run with other settings ({'; '.join(refused)}); resuming it with these would mix "
                "two runs' checkpoints",
                "leave these overrides out to resume the run as it is, pick a new run.dir, or pass run.resume=force "
                f"to resume it changing {'; '.join(refused)}")])
        changed = [line if resumable(key) else f"{line} (run.resume=force)" for key, line in diff]
        if changed:  # keep the previous config next to the new one: nothing is lost
            (path / f"config.before-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(dump_yaml(old))
    (path / "logs").mkdir(parents=True, exist_ok=True)
    save_frozen(cfg, config_path)
    with open(path / "command.txt", "a") as f:
        f.write(shlex.join(argv) + "\n")
    (path / "overrides.txt").write_text("".join(f"{o}\n" for o in overrides))
    return RunDir(path, resumed, changed, lock)


def write_plan(run: RunDir, specs: list[ProcessSpec]) -> Path:
    out = run.path / "plan.json"
    out.write_text(json.dumps([s.to_json() for s in specs], indent=2))
    return out
