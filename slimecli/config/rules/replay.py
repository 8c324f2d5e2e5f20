"""rollout.replay and rollout.replay_steps against the rest of the run."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig


def replay(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.rollout
    errors = []
    if r.replay_steps and not r.replay:
        errors.append(ConfigError("rollout.replay_steps", list(r.replay_steps), "replays steps of a rollout dump",
                                  "add rollout.replay=RUN (a run trained with rollout.dump=true)"))
    bad = [k for k in r.replay_steps if not 1 <= k <= cfg.trainer.max_steps]
    if bad:
        errors.append(ConfigError("rollout.replay_steps", list(r.replay_steps),
                                  f"step {bad[0]} is not one of 1..trainer.max_steps ({cfg.trainer.max_steps})"))
    if len(set(r.replay_steps)) != len(r.replay_steps):
        errors.append(ConfigError("rollout.replay_steps", list(r.replay_steps), "names a step twice"))
    return errors


RULES = [replay]
