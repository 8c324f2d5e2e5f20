"""Advantage estimators and policy losses by name (verl's register_adv_est / register_policy_loss), so a recipe
can add its own without editing the trainer.

A config names a registered function (``trainer.advantage_estimator=grpo``) or an import path
(``trainer.advantage_estimator=my.module:fn`` or ``/path/to/file.py:fn``). Both kinds live in the one plugin
registry (slimecli.config.registry); the built-ins are declared in train/plugins.py, so config validation knows
them without importing torch. Tests swap entries in with ``ADVANTAGE_ESTIMATORS.override(...)``.
"""

from __future__ import annotations

from collections.abc import Callable

from slimecli.config.registry import (
    ADVANTAGE_ESTIMATORS,
    OFF_POLICY_CORRECTIONS,
    POLICY_LOSSES,
    AdvantageFn,
    Entry,
    OffPolicyFn,
    PolicyLossFn,
)

__all__ = ["ADVANTAGE_ESTIMATORS", "OFF_POLICY_CORRECTIONS", "POLICY_LOSSES", "AdvantageFn", "Entry", "OffPolicyFn",
           "PolicyLossFn", "get_advantage_estimator", "get_off_policy_correction", "get_policy_loss",
           "register_advantage_estimator", "register_policy_loss", "uses_critic"]


def get_off_policy_correction(name: str) -> Entry[OffPolicyFn]:
    return OFF_POLICY_CORRECTIONS.get(name)


def register_advantage_estimator(name: str, *, whiten: bool = False, critic: bool = False
                                 ) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register ``fn(batch: AdvantageBatch, cfg: TrainerConfig) -> advantages [B, T] or (advantages, returns)``.

    whiten=True: the trainer whitens the advantages over the batch's valid tokens after the OPD term.
    critic=True: the trainer builds a value model (trainer.critic), fills ``batch.values`` and trains the
    critic on the returns, which must then be given.
    """
    return ADVANTAGE_ESTIMATORS.decorator(name, whiten=whiten, critic=critic)


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register ``fn(log_ratio, advantages, cfg) -> (per-token loss, {metric: per-token values})``, all [B, T].

    ``log_ratio`` (token- or sequence-level, per trainer.importance_level) carries the gradient; the trainer
    applies TIS, the loss weights, entropy and KL terms around it.
    """
    return POLICY_LOSSES.decorator(name)


def get_advantage_estimator(name: str) -> Entry[AdvantageFn]:
    return ADVANTAGE_ESTIMATORS.get(name)


def get_policy_loss(name: str) -> Entry[PolicyLossFn]:
    return POLICY_LOSSES.get(name)


def uses_critic(name: str) -> bool:
    """Whether trainer.advantage_estimator ``name`` needs the critic's values (registered with critic=True)."""
    return bool(get_advantage_estimator(name).options.get("critic"))
