"""The run directory: resolved config, command line, overrides, plan, logs, metrics, checkpoints."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from slimecli.config.convert import to_plain
from slimecli.config.io import dump_yaml, load_frozen, save_frozen
from slimecli.config.schema import SlimeConfig
from slimecli.launch.plan import CONFIG_FILE
from slimecli.launch.spec import ProcessSpec


@dataclass(frozen=True)
class RunDir:
    path: Path
    resumed: bool
    changed: list[str]  # config keys that differ from the stored config of a resumed run

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def log_dir(self) -> Path:
        return self.path / "logs"


def default_path(cfg: SlimeConfig) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser()
    return Path(cfg.run.root).expanduser() / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _diff(old: object, new: object, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [f"{prefix}: {old!r} -> {new!r}"] if old != new else []


def prepare(cfg: SlimeConfig, argv: list[str], overrides: list[str]) -> RunDir:
    """Create (or reopen, as a resume) the run directory and write the frozen config into it."""
    path = default_path(cfg).resolve()
    config_path = path / CONFIG_FILE
    resumed = config_path.is_file()
    changed: list[str] = []
    if resumed:
        old = load_frozen(config_path)
        changed = _diff(to_plain(old), to_plain(cfg))
        if changed:  # keep the previous config next to the new one: nothing is lost
            (path / f"config.before-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(dump_yaml(old))
    (path / "logs").mkdir(parents=True, exist_ok=True)
    save_frozen(cfg, config_path)
    with open(path / "command.txt", "a") as f:
        f.write(shlex.join(argv) + "\n")
    (path / "overrides.txt").write_text("".join(f"{o}\n" for o in overrides))
    return RunDir(path, resumed, changed)


def write_plan(run: RunDir, specs: list[ProcessSpec]) -> Path:
    out = run.path / "plan.json"
    out.write_text(json.dumps([s.to_json() for s in specs], indent=2))
    return out
