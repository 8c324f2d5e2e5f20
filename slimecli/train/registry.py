"""Name -> function registries for advantage estimators and policy losses (verl's register_adv_est /
register_policy_loss), so a recipe can add its own without editing the trainer.

A config names a registered function (``trainer.advantage_estimator=grpo``) or an import path
(``trainer.advantage_estimator=my.module:fn`` or ``/path/to/file.py:fn``). The built-ins live in
advantages.py and losses.py and register themselves when those modules are imported; their names are
listed here so that config validation knows them without importing torch.

Tests swap entries in with ``override(...)``, which restores the registry on exit.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from slimecli.config import names as config_names
from slimecli.config.errors import allowed_hint
from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.import_path import PATH_HINT, is_import_path

# The config layer owns the built-in names (validation must know them without importing torch).
BUILTIN_ADVANTAGE_ESTIMATORS = config_names.BUILTIN[config_names.ADVANTAGE_ESTIMATOR]
BUILTIN_POLICY_LOSSES = config_names.BUILTIN[config_names.POLICY_LOSS]
# Deprecated estimator names: gspo is grpo's advantages with a sequence-level importance ratio
# (trainer.importance_level=sequence); resolve_deprecated maps it.
DEPRECATED_ADVANTAGE_ESTIMATORS = config_names.DEPRECATED_ADVANTAGE_ESTIMATORS

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def resolve_deprecated(cfg: TrainerConfig) -> TrainerConfig:
    """trainer.advantage_estimator=gspo (deprecated) = grpo advantages + trainer.importance_level=sequence."""
    replacement = DEPRECATED_ADVANTAGE_ESTIMATORS.get(cfg.advantage_estimator)
    if replacement is None:
        return cfg
    return dataclasses.replace(cfg, advantage_estimator=replacement, importance_level="sequence")


class UnknownNameError(KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown name"


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)  # e.g. whiten=True for an advantage estimator


class Registry:
    """One kind of pluggable function: register by decorator, look up by name or import path."""

    def __init__(self, kind: str, config_key: str, builtins: tuple[str, ...], builtin_module: str):
        self.kind = kind
        self.config_key = config_key
        self.builtins = builtins
        self.builtin_module = builtin_module  # imported on first lookup: it registers the built-ins
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, **options: Any) -> Decorator:
        """Decorator: make ``name`` resolve to the function; registering a name again replaces it."""
        if not name or not isinstance(name, str) or is_import_path(name):
            raise ValueError(f"{self.kind} name must be a non-empty string without ':', got {name!r}")

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(fn):
                raise TypeError(f"{self.kind} {name!r}: {fn!r} is not callable")
            self._entries[name] = Entry(name, fn, dict(options))
            config_names.declare(self.config_key, name)  # a config naming it validates in this process
            return fn

        return decorate

    def names(self) -> list[str]:
        """Built-in and registered names (without importing the built-ins' module)."""
        return list(dict.fromkeys([*self.builtins, *self._entries]))

    def get(self, name: str) -> Entry:
        """The entry for a registered name or an import path; unknown names get a did-you-mean."""
        if is_import_path(name):
            return Entry(name, _load_path(name, self.config_key))
        if name not in self._entries:
            importlib.import_module(self.builtin_module)
        entry = self._entries.get(name)
        if entry is None:
            hint = allowed_hint(name, self.names())
            raise UnknownNameError(f"{self.config_key}: unknown {self.kind} {name!r}; {hint}, {PATH_HINT}")
        return entry

    @contextmanager
    def override(self, **fns: Callable[..., Any]) -> Iterator[Registry]:
        """Register ``name=fn`` entries for the duration of a with-block, then restore the registry exactly."""
        importlib.import_module(self.builtin_module)  # built-ins first, so they are part of what is restored
        saved = dict(self._entries)
        with config_names.scoped():
            try:
                for name, fn in fns.items():
                    self.register(name)(fn)
                yield self
            finally:
                self._entries.clear()
                self._entries.update(saved)


def _load_path(spec: str, config_key: str) -> Callable[..., Any]:
    from slimecli.reward.python_fn import load_reward_fn  # the project's one loader for user functions

    try:
        return load_reward_fn(spec)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"{config_key}={spec!r}: cannot load the function: {exc}") from exc


ADVANTAGE_ESTIMATORS = Registry("advantage estimator", "trainer.advantage_estimator", BUILTIN_ADVANTAGE_ESTIMATORS,
                                "slimecli.train.advantages")
POLICY_LOSSES = Registry("policy loss", "trainer.policy_loss", BUILTIN_POLICY_LOSSES, "slimecli.train.losses")


def register_advantage_estimator(name: str, *, whiten: bool = False) -> Decorator:
    """Register ``fn(batch: AdvantageBatch, cfg: TrainerConfig) -> advantages [B, T] or (advantages, returns)``.

    whiten=True: the trainer whitens the advantages over the batch's valid tokens after the OPD term.
    """
    return ADVANTAGE_ESTIMATORS.register(name, whiten=whiten)


def register_policy_loss(name: str) -> Decorator:
    """Register ``fn(log_ratio, advantages, cfg) -> (per-token loss, {metric: per-token values})``, all [B, T].

    ``log_ratio`` (token- or sequence-level, per trainer.importance_level) carries the gradient; the trainer
    applies TIS, the loss weights, entropy and KL terms around it.
    """
    return POLICY_LOSSES.register(name)


def get_advantage_estimator(name: str) -> Entry:
    return ADVANTAGE_ESTIMATORS.get(DEPRECATED_ADVANTAGE_ESTIMATORS.get(name, name))


def get_policy_loss(name: str) -> Entry:
    return POLICY_LOSSES.get(name)
