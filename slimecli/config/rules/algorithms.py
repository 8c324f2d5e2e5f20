"""The algorithm settings that span groups: DAPO's overlong shaping against the rollout's budget, and PPO's critic
(trainer.advantage_estimator=gae) against the trainer back-ends it runs on."""

from __future__ import annotations

import dataclasses

from slimecli.config.errors import ConfigError
from slimecli.config.groups.critic import CriticConfig
from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.schema import SlimeConfig


def uses_critic(estimator: str) -> bool:
    """Whether a built-in estimator takes the critic's values (declared with critic=True; torch-free)."""
    from slimecli.config.registry import ADVANTAGE_ESTIMATORS

    declared = ADVANTAGE_ESTIMATORS.declared().get(estimator)
    return bool(declared and declared[1].get("critic"))


def overlong(cfg: SlimeConfig) -> list[ConfigError]:
    """trainer.overlong_buffer: the last tokens of rollout.max_new_tokens, on single-turn rollouts (a multi-turn
    response has no one budget to be near the end of)."""
    t, r = cfg.trainer, cfg.rollout
    if t.overlong_buffer == 0:
        if t.overlong_penalty != TrainerConfig.overlong_penalty:
            return [ConfigError("trainer.overlong_penalty", t.overlong_penalty, "applies to DAPO's overlong shaping, "
                                "which is off (trainer.overlong_buffer=0)", "set trainer.overlong_buffer=N as well")]
        return []
    errors = []
    if t.overlong_buffer > r.max_new_tokens:
        errors.append(ConfigError("trainer.overlong_buffer", t.overlong_buffer,
                                  f"must be <= rollout.max_new_tokens ({r.max_new_tokens}): the penalty falls over "
                                  "the last overlong_buffer tokens of that budget",
                                  f"set trainer.overlong_buffer to at most {r.max_new_tokens}"))
    if r.generate != "single_turn" or cfg.env.name != "none":
        what = f"rollout.generate={r.generate}" if r.generate != "single_turn" else f"env={cfg.env.name}"
        errors.append(ConfigError("trainer.overlong_buffer", t.overlong_buffer,
                                  f"shapes single-turn responses by rollout.max_new_tokens; {what} makes responses "
                                  "of several turns, each with its own budget",
                                  "drop trainer.overlong_buffer (set it to 0)"))
    return errors


def critic(cfg: SlimeConfig) -> list[ConfigError]:
    """trainer.advantage_estimator=gae trains a value model beside a trainer=torch DDP policy."""
    t = cfg.trainer
    if not uses_critic(t.advantage_estimator):
        changed = [f for f in dataclasses.fields(CriticConfig) if getattr(t.critic, f.name) != f.default]
        return [ConfigError(f"trainer.critic.{f.name}", getattr(t.critic, f.name),
                            f"applies to a critic, which trainer.advantage_estimator={t.advantage_estimator} has none of",
                            "set trainer.advantage_estimator=gae, or drop it") for f in changed]
    key, value = "trainer.advantage_estimator", t.advantage_estimator
    errors = []
    if t.name == "megatron":
        errors.append(ConfigError(key, value, "the critic (a Hugging Face value model) runs beside trainer=torch "
                                  "only; trainer=megatron has no value model yet",
                                  "use trainer=torch, or an estimator without a critic (grpo, reinforce_plus_plus)"))
    if t.strategy == "fsdp":
        errors.append(ConfigError(key, value, "the critic is replicated on every rank (DDP); with "
                                  "trainer.strategy=fsdp the policy is sharded and the critic is not supported yet",
                                  "use trainer.strategy=ddp with advantage_estimator=gae"))
    if t.lora.enabled:
        errors.append(ConfigError(key, value, "the critic is not supported with trainer.lora yet",
                                  "set trainer.lora.rank=0 with advantage_estimator=gae"))
    return errors


def cispo(cfg: SlimeConfig) -> list[ConfigError]:
    """trainer.cispo_eps_* set for another policy loss would be silently unread."""
    t = cfg.trainer
    if t.policy_loss == "cispo":
        return []
    return [ConfigError(f"trainer.{name}", getattr(t, name), f"applies to trainer.policy_loss=cispo, not "
                        f"{t.policy_loss}", "set trainer.policy_loss=cispo, or drop it")
            for name in ("cispo_eps_low", "cispo_eps_high") if getattr(t, name) != getattr(TrainerConfig, name)]


RULES = [overlong, critic, cispo]
