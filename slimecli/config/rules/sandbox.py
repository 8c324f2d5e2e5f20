"""Sandbox rules: a known kind, positive limits, an unprivileged uid, absolute read-only paths."""

from __future__ import annotations

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.registry import SANDBOXES
from slimecli.config.schema import SlimeConfig

LIMITS = ("max_processes", "max_file_mb", "memory_mb", "disk_mb", "tmp_mb", "max_concurrent_boots", "start_timeout_s")


def kind(cfg: SlimeConfig) -> list[ConfigError]:
    name = cfg.sandbox.name
    kinds = ["auto", *SANDBOXES.names()]  # auto: bwrap where it starts, else local (slimecli.sandbox.factory)
    if name not in kinds:
        return [ConfigError("sandbox.name", name, "unknown sandbox", allowed_hint(name, kinds))]
    return []


def limits(cfg: SlimeConfig) -> list[ConfigError]:
    s = cfg.sandbox
    errors = [ConfigError(f"sandbox.{key}", getattr(s, key), "must be > 0") for key in LIMITS if getattr(s, key) <= 0]
    if s.uid <= 0:
        errors.append(ConfigError("sandbox.uid", s.uid, "must be an unprivileged uid (> 0)",
                                  "65534 (nobody) works everywhere"))
    for i, path in enumerate(s.extra_ro_paths):
        if not path.startswith("/"):
            errors.append(ConfigError(f"sandbox.extra_ro_paths[{i}]", path, "must be an absolute path"))
    if s.name in ("docker", "podman") and not s.image:
        errors.append(ConfigError("sandbox.image", s.image, f"sandbox={s.name} needs a default image"))
    return errors


RULES = [kind, limits]
