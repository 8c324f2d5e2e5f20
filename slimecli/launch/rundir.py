"""The run directory: resolved config, command line, overrides, plan, logs, metrics, checkpoints.

A new auto-named directory is created exclusively (two commands started in the same second get two);
every command that runs in one holds its lock (launch/lock.py); a resume may change only what keeps
the run meaningful unless run.resume=force.
"""

from __future__ import annotations

import json
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
    return [(prefix, old, new)] if old != new else []


def resumable(key: str) -> bool:
    """What a resume may change without run.resume=force: the schema's field specs say (see SlimeConfig)."""
    return is_resumable(SlimeConfig, key)


def resume_command(path: Path, overrides: list[str], then: list[str] | tuple[str, ...] = ()) -> str:
    """The command that resumes the run in ``path``: the same overrides (those of ``then`` replacing any of the
    same key), with run.dir naming it absolutely (an auto-named run has no run.dir of its own)."""
    def key(override: str) -> str:
        return override.partition("=")[0].lstrip("+~")

    replaced = {"run.dir", "run.resume", *map(key, then)}
    kept = [o for o in overrides if key(o) not in replaced]
    return shlex.join(["slimecli", "train", *kept, *then, f"run.dir={path.resolve()}"])


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
        # run.dir never differs between a run and its resume: the stored config was found in the directory being
        # resumed, whatever it says (null for an auto-named run, a path relative to another working directory,
        # the absolute path, or where the directory was before it was moved)
        # nor its ports: where the servers listen is picked afresh by each start ("auto") and is no part of the run
        diff = [d for d in _diff(to_plain(old), to_plain(cfg)) if d[0] != "run.dir" and not is_port_key(d[0])]
        refused = [key for key, _, _ in diff if not resumable(key)]
        if refused and cfg.run.resume != "force":
            lock.release()
            raise ConfigErrors([ConfigError(
                "run.resume", cfg.run.resume,
                f"{path} holds a run with another {', '.join(refused)}; resuming it would mix two runs' checkpoints",
                "pick a new run.dir, or pass run.resume=force to resume with the changed config")])
        changed = [f"{key}: {a!r} -> {b!r}" for key, a, b in diff]
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
