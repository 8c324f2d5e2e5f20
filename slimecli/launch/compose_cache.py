"""Composed configs cached between commands: `config show`, `validate`, `plan` and `train` compose the same tree
again and again, and importing Hydra and composing with it is most of what they spend before their own work.

The cache holds the plain dict compose_dict returns (before the schema and the rules, which run every time), keyed
by everything composition reads: the overrides, the recipe directories, SWE_AGENT and SLIMECLI_RECIPE_PATH, every
file of the conf tree and of the recipe directories (path, size, mtime), a recipe named by path, the config layer's
own code and the installed Hydra and OmegaConf. A composition with errors, with an interpolation on the command
line, or with a value JSON cannot hold exactly is not cached. SLIMECLI_COMPOSE_CACHE names the directory, or turns
the cache off (`off`); the default is ~/.cache/slimecli/compose ($XDG_CACHE_HOME). Any problem with the cache
directory (read-only, full) only means composing afresh.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

from slimecli.config import compose as c
from slimecli.config import recipes as recipe_lib
from slimecli.config.errors import ConfigError
from slimecli.config.paths import conf_dir

log = logging.getLogger(__name__)

CACHE_ENV = "SLIMECLI_COMPOSE_CACHE"
OFF = ("off", "0", "false", "no")
FORMAT = 1  # bumped when what an entry holds changes
MAX_ENTRIES = 256  # older entries are removed past this many
CONFIG_CODE = Path(c.__file__).resolve().parent  # slimecli/config: composition's own code


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "slimecli" / "compose"


def compose_cached(overrides: list[str], recipe_dirs: tuple[str, ...] = (), uses_agent: bool = False
                   ) -> tuple[dict[str, Any], list[ConfigError]]:
    """compose_dict's answer, from the cache where the same inputs were composed before (a c.Composer)."""
    where = cache_dir()
    if where is None or any("${" in text for text in overrides):
        return c.compose_dict(overrides, recipe_dirs, uses_agent)
    path = where / f"{entry_key(overrides, recipe_dirs, uses_agent)}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not there yet, or a torn or foreign file: compose afresh
        data = None
    if isinstance(data, dict):
        return data, []
    data, errors = c.compose_dict(overrides, recipe_dirs, uses_agent)
    if not errors:
        _store(path, data)
    return data, errors


def entry_key(overrides: list[str], recipe_dirs: tuple[str, ...], uses_agent: bool) -> str:
    """A digest of everything composition reads."""
    import hashlib  # here: OpenSSL's load is paid only with the cache on

    dirs = [conf_dir(), *recipe_lib.search_dirs(recipe_dirs)]
    files = [str(d) for d in dirs] + [_stamp(p) for d in dirs for p in _files(d)]
    for text in overrides:  # +recipe=PATH: that file
        key, _, value = text.partition("=")
        if key.lstrip("+") == "recipe" and recipe_lib.looks_like_path(value.strip("'\"")):
            files.append(_stamp(Path(value.strip("'\"")).expanduser()))
    code = [_stamp(p) for p in sorted(CONFIG_CODE.rglob("*.py"))]
    packages = [_stamp(Path(origin)) for origin in map(_origin, ("hydra", "omegaconf")) if origin]
    material = {"format": FORMAT, "overrides": list(overrides), "recipe_dirs": list(recipe_dirs),
                "uses_agent": uses_agent, "env": [os.environ.get(c.AGENT_ENV), os.environ.get(recipe_lib.RECIPE_PATH_ENV)],
                "files": files, "code": code, "packages": packages}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def _files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.rglob("*") if p.is_file())
    except OSError:
        return []


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _origin(package: str) -> str | None:
    """The installed package's __init__ (its mtime changes when it is reinstalled), found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _store(path: Path, data: dict[str, Any]) -> None:
    try:
        text = json.dumps(data)
    except (TypeError, ValueError):  # a value JSON cannot hold
        return
    if json.loads(text) != data:  # NaN, or a mapping with non-string keys: not held exactly
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        _prune(path.parent)
    except OSError as exc:
        log.debug("compose cache not written at %s: %s", path, exc)


def _prune(directory: Path) -> None:
    entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    for old in entries[:-MAX_ENTRIES]:
        old.unlink(missing_ok=True)
