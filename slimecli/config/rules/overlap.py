"""trainer.async_rollout against what the overlap has to share with the trainer."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig


def overlap(cfg: SlimeConfig) -> list[ConfigError]:
    t = cfg.trainer
    errors = []
    if t.async_rollout and t.weight_sync == "shared_memory":
        errors.append(ConfigError("trainer.async_rollout", True,
                                  "trainer.weight_sync=shared_memory lets the engines read the trainer's own "
                                  "weights, which the overlapped training step changes mid-rollout",
                                  "use trainer.weight_sync=disk or nccl with trainer.async_rollout=true"))
    return errors


RULES = [overlap]
