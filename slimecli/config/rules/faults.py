"""run.on_stall, run.max_restarts and run.stall_timeout_s against each other; the servers' health probes."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.groups.rollout import RolloutConfig
from slimecli.config.groups.teacher import TeacherConfig
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import run_teachers


def faults(cfg: SlimeConfig) -> list[ConfigError]:
    errors = _health("rollout", cfg.rollout) + [e for t in run_teachers(cfg) for e in _health(t.key, t.settings)]
    r = cfg.run
    if r.on_stall != "restart":
        return errors
    if r.max_restarts == 0:
        errors.append(ConfigError("run.on_stall", r.on_stall, "restarts within run.max_restarts, which is 0",
                                  "add run.max_restarts=N (N > 0), or run.on_stall=fail"))
    if r.stall_timeout_s == 0:
        errors.append(ConfigError("run.on_stall", r.on_stall, "a stall is never detected with run.stall_timeout_s=0",
                                  "set run.stall_timeout_s to the seconds a step may take"))
    return errors


def _health(group: str, part: RolloutConfig | TeacherConfig) -> list[ConfigError]:
    """A server is declared hung after health_timeout_s without an answer: at least one probe must fit in it."""
    if part.health_timeout_s >= part.health_interval_s:
        return []
    return [ConfigError(f"{group}.health_timeout_s", part.health_timeout_s,
                        f"at least {group}.health_interval_s ({part.health_interval_s}): no probe would be "
                        "answered in time", f"raise {group}.health_timeout_s or lower {group}.health_interval_s")]


RULES = [faults]
