"""Cross-field rules, checked after the schema. Each rule module exposes RULES: a list of
functions taking the config and returning ConfigErrors; register new modules in _MODULES."""

from __future__ import annotations

import importlib

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig

_MODULES = ("core", "optimizer", "teacher", "reward", "agent", "task", "sandbox", "weight_sync", "lora", "overlap", "slurm", "eval", "ports", "env", "replay", "faults", "algorithms")


def check_all(cfg: SlimeConfig) -> list[ConfigError]:
    errors: list[ConfigError] = []
    for name in _MODULES:
        module = importlib.import_module(f"slimecli.config.rules.{name}")
        for rule in module.RULES:
            errors.extend(rule(cfg))
    return errors
