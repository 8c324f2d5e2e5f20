"""Reward rules: the reward exists, its function or server is named, its key names a value (whether the function
is there is a pre-flight check: slimecli/launch/source_checks.py)."""

from __future__ import annotations

from urllib.parse import urlparse

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.import_path import FORMAT_HINT
from slimecli.config.registry import REWARDS
from slimecli.config.schema import SlimeConfig


def known(cfg: SlimeConfig) -> list[ConfigError]:
    names = sorted(REWARDS.names())
    if cfg.reward.name not in names:
        return [ConfigError("reward.name", cfg.reward.name, "unknown reward", allowed_hint(cfg.reward.name, names))]
    return []


def function(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.reward
    if r.path is None:
        if r.name == "python":
            return [ConfigError("reward.path", None, "reward=python needs reward.path", FORMAT_HINT)]
        if r.group:
            return [ConfigError("reward.group", True, "reward.group=true applies to a python function",
                                "set reward.path=... (reward=python) or drop reward.group")]
    return []


def server(cfg: SlimeConfig) -> list[ConfigError]:
    url = cfg.reward.url
    if cfg.reward.name == "remote" and not url:
        return [ConfigError("reward.url", url, "reward=remote needs the URL of the reward server",
                            "e.g. reward.url=http://127.0.0.1:8000/reward")]
    if url is not None:
        parsed = urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            return [ConfigError("reward.url", url, "must be an http:// or https:// URL with a host")]
    return []


def key(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.reward
    errors = []
    if r.key is not None and not str(r.key).strip():
        errors.append(ConfigError("reward.key", r.key, "must be a non-empty key name (or null for numeric rewards)"))
    return errors


RULES = [known, function, server, key]
