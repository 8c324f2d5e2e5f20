"""trainer.async_rollout against what the overlap has to share with the trainer, and what needs it."""

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
    if not t.async_rollout:
        synchronous = "a synchronous run trains every rollout on the weights that generated it"
        hint = "add trainer.async_rollout=true"
        if t.max_staleness > 1:
            errors.append(ConfigError("trainer.max_staleness", t.max_staleness,
                                      f"rollouts ahead of the trainer need trainer.async_rollout=true ({synchronous})",
                                      hint))
        if t.partial_rollouts:
            errors.append(ConfigError("trainer.partial_rollouts", True,
                                      f"no request is in flight at a weight push without trainer.async_rollout "
                                      f"({synchronous})", hint))
        if t.staleness_strategy != "wait":
            errors.append(ConfigError("trainer.staleness_strategy", t.staleness_strategy,
                                      f"nothing is stale without trainer.async_rollout ({synchronous})", hint))
    return errors


RULES = [overlap]
