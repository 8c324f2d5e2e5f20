"""The frozen run config on disk: written once by the controller, read by every worker."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from slimecli.config.canonical import announce, as_written, canonicalize
from slimecli.config.convert import MAX_DEPTH, build, nesting_depth, to_plain
from slimecli.config.errors import NO_VALUE, ConfigError, ConfigErrors
from slimecli.config.schema import SlimeConfig


def dump_yaml(cfg: SlimeConfig) -> str:
    # PyYAML has no stubs installed here (Any); without a stream, safe_dump returns the text
    text: str = yaml.safe_dump(to_plain(cfg), sort_keys=False, default_flow_style=None)
    return text


def save_frozen(cfg: SlimeConfig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dump_yaml(cfg))
    tmp.replace(path)
    return path


def load_frozen(path: str | Path) -> SlimeConfig:
    """Read a resolved config; it is type-checked again but never re-composed."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, huge ints
        problem = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigErrors([ConfigError(str(path), NO_VALUE, f"cannot read the run config: {problem}")]) from None
    if nesting_depth(data, MAX_DEPTH + 2) > MAX_DEPTH + 2:  # the file and its sections are two levels
        raise ConfigErrors([ConfigError(str(path), NO_VALUE, f"values nest deeper than {MAX_DEPTH} levels")])
    if not isinstance(data, dict):
        raise ConfigErrors([ConfigError(str(path), data, "the run config must be a mapping")])
    errors: list[ConfigError] = []
    rewrites = canonicalize(data)  # a run frozen before a spelling was deprecated
    cfg = build(SlimeConfig, data, "", errors)
    if errors or cfg is None:
        raise ConfigErrors(as_written(errors, rewrites))
    announce(rewrites)
    return cfg


def load_frozen_or_exit(path: str | Path) -> SlimeConfig:
    """load_frozen for a process's entry point: on any error print it on stderr and exit 2 (no traceback)."""
    if not Path(path).is_file():
        print(f"--config: no such file: {path}", file=sys.stderr)
        raise SystemExit(2)
    try:
        return load_frozen(path)
    except ConfigErrors as exc:
        print(f"{path}: " + exc.render(), file=sys.stderr)
        raise SystemExit(2) from None
