"""Optimizer rules: stateless Adam keeps no moments, so nothing may need them."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig


def stateless(cfg: SlimeConfig) -> list[ConfigError]:
    o = cfg.optimizer
    if o.name != "stateless_adam":
        return []
    errors = []
    if o.amsgrad:
        errors.append(ConfigError("optimizer.amsgrad", o.amsgrad, "stateless_adam keeps no moments, so amsgrad is impossible",
                                  "set optimizer.amsgrad=false or use optimizer=adam"))
    if o.save_state:
        errors.append(ConfigError("optimizer.save_state", o.save_state, "stateless_adam has no optimizer state to save",
                                  "set optimizer.save_state=false"))
    return errors


def adam_semantics(cfg: SlimeConfig) -> list[ConfigError]:
    """Switching bias correction off is not Adam as torch and megatron-core implement it."""
    o = cfg.optimizer
    if o.name == "adam" and not o.bias_correction:
        return [ConfigError("optimizer.bias_correction", o.bias_correction,
                            "optimizer=adam always applies bias correction (torch and megatron-core Adam)",
                            "set optimizer.bias_correction=true or use optimizer=stateless_adam")]
    return []


def schedule(cfg: SlimeConfig) -> list[ConfigError]:
    o = cfg.optimizer
    if o.lr_decay_style == "constant":
        return []
    if o.lr_decay_steps is None:
        end, where = cfg.trainer.max_steps, f"trainer.max_steps={cfg.trainer.max_steps} (optimizer.lr_decay_steps is null)"
    else:
        end, where = o.lr_decay_steps, f"optimizer.lr_decay_steps={o.lr_decay_steps}"
    if o.lr_warmup_steps > end:
        return [ConfigError("optimizer.lr_warmup_steps", o.lr_warmup_steps,
                            f"warm-up must end before the {o.lr_decay_style} decay does: must be <= {where}")]
    return []


def min_lr(cfg: SlimeConfig) -> list[ConfigError]:
    o = cfg.optimizer
    if o.min_lr > o.lr:
        return [ConfigError("optimizer.min_lr", o.min_lr, f"must be in [0, optimizer.lr={o.lr}]")]
    return []


RULES = [stateless, adam_semantics, min_lr, schedule]
