"""Advantage estimators and policy losses by name (verl's register_adv_est / register_policy_loss), so a recipe
can add its own without editing the trainer.

A config names a registered function (``trainer.advantage_estimator=grpo``) or an import path
(``trainer.advantage_estimator=my.module:fn`` or ``/path/to/file.py:fn``). Both kinds live in the one plugin
registry (slimecli.config.registry); the built-ins are declared in train/plugins.py, so config validation knows
them without importing torch. Tests swap entries in with ``ADVANTAGE_ESTIMATORS.override(...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.registry import ADVANTAGE_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES, Entry

__all__ = ["ADVANTAGE_ESTIMATORS", "OFF_POLICY_CORRECTIONS", "POLICY_LOSSES", "Entry", "get_advantage_estimator",
           "get_off_policy_correction", "get_policy_loss",
           "register_advantage_estimator", "register_policy_loss", "resolve_deprecated", "uses_critic"]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def resolve_deprecated(cfg: TrainerConfig) -> TrainerConfig:
    """The deprecated spellings in their current form: trainer.advantage_estimator=gspo = grpo advantages with
    trainer.importance_level=sequence; trainer.use_tis=true = trainer.off_policy_correction=tis."""
    replacement = ADVANTAGE_ESTIMATORS.aliases.get(cfg.advantage_estimator)
    if replacement is not None:
        cfg = dataclasses.replace(cfg, advantage_estimator=replacement, importance_level="sequence")
    if cfg.use_tis and cfg.off_policy_correction == "none":
        cfg = dataclasses.replace(cfg, off_policy_correction="tis")
    return cfg


def get_off_policy_correction(name: str) -> Entry:
    return OFF_POLICY_CORRECTIONS.get(name)


def register_advantage_estimator(name: str, *, whiten: bool = False, critic: bool = False) -> Decorator:
    """Register ``fn(batch: AdvantageBatch, cfg: TrainerConfig) -> advantages [B, T] or (advantages, returns)``.

    whiten=True: the trainer whitens the advantages over the batch's valid tokens after the OPD term.
    critic=True: the trainer builds a value model (trainer.critic), fills ``batch.values`` and trains the
    critic on the returns, which must then be given.
    """
    return ADVANTAGE_ESTIMATORS.decorator(name, whiten=whiten, critic=critic)


def register_policy_loss(name: str) -> Decorator:
    """Register ``fn(log_ratio, advantages, cfg) -> (per-token loss, {metric: per-token values})``, all [B, T].

    ``log_ratio`` (token- or sequence-level, per trainer.importance_level) carries the gradient; the trainer
    applies TIS, the loss weights, entropy and KL terms around it.
    """
    return POLICY_LOSSES.decorator(name)


def get_advantage_estimator(name: str) -> Entry:
    return ADVANTAGE_ESTIMATORS.get(name)


def get_policy_loss(name: str) -> Entry:
    return POLICY_LOSSES.get(name)


def uses_critic(name: str) -> bool:
    """Whether trainer.advantage_estimator ``name`` needs the critic's values (registered with critic=True)."""
    return bool(get_advantage_estimator(name).options.get("critic"))
