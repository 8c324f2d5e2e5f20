"""Sandbox rules: a known kind, absolute read-only paths, a default image for containers (limits: the schema)."""

from __future__ import annotations

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.registry import SANDBOXES
from slimecli.config.schema import SlimeConfig


def kind(cfg: SlimeConfig) -> list[ConfigError]:
    name = cfg.sandbox.name
    kinds = ["auto", *SANDBOXES.names()]  # auto: the first that starts here, never local (sandbox/auto.py)
    if name not in kinds:
        return [ConfigError("sandbox.name", name, "unknown sandbox", allowed_hint(name, kinds))]
    return []


def paths_and_image(cfg: SlimeConfig) -> list[ConfigError]:
    s = cfg.sandbox
    errors = []
    for i, path in enumerate(s.extra_ro_paths):
        if not path.startswith("/"):
            errors.append(ConfigError(f"sandbox.extra_ro_paths[{i}]", path, "must be an absolute path"))
    if s.name in ("docker", "podman") and not s.image:
        errors.append(ConfigError("sandbox.image", s.image, f"sandbox={s.name} needs a default image"))
    return errors


RULES = [kind, paths_and_image]
