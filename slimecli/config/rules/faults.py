"""run.on_stall, run.max_restarts and run.stall_timeout_s against each other."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig


def faults(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.run
    if r.on_stall != "restart":
        return []
    errors = []
    if r.max_restarts == 0:
        errors.append(ConfigError("run.on_stall", r.on_stall, "restarts within run.max_restarts, which is 0",
                                  "add run.max_restarts=N (N > 0), or run.on_stall=fail"))
    if r.stall_timeout_s == 0:
        errors.append(ConfigError("run.on_stall", r.on_stall, "a stall is never detected with run.stall_timeout_s=0",
                                  "set run.stall_timeout_s to the seconds a step may take"))
    return errors


RULES = [faults]
