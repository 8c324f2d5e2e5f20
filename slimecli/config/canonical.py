"""Deprecated spellings rewritten into their current form where a config enters: composed from the command line
(compose.load, a resume's stored config included) or read from a run's frozen file (io.load_frozen).

Nothing below the config layer meets an old spelling: the trainer reads `advantage_estimator=grpo` with
`importance_level=sequence`, never `gspo`. The user's keys keep working; each rewrite logs one deprecation line,
and an error about a rewritten key names the key the user wrote.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from slimecli.config.errors import ConfigError

log = logging.getLogger("slimecli.config")


@dataclass(frozen=True)
class Rewrite:
    """``key=value`` as the user wrote it, and the keys it was rewritten into."""

    key: str
    value: Any
    into: dict[str, Any]

    def line(self) -> str:
        current = " ".join(f"{k}={_word(v)}" for k, v in self.into.items())
        return f"{self.key}={_word(self.value)} is deprecated: it is read as {current}; set that instead"


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _section(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    node = data.get(name)
    return node if isinstance(node, dict) else None


def canonicalize(data: dict[str, Any]) -> list[Rewrite]:
    """Rewrite ``data`` (plain composed data, in place) into the current spelling; the rewrites made."""
    done: list[Rewrite] = []
    trainer = _section(data, "trainer")
    if trainer is not None:
        # gspo = grpo's advantages with GSPO's sequence-level importance ratio
        if trainer.get("advantage_estimator") == "gspo":
            trainer["advantage_estimator"], trainer["importance_level"] = "grpo", "sequence"
            done.append(Rewrite("trainer.advantage_estimator", "gspo", {"trainer.advantage_estimator": "grpo",
                                                                        "trainer.importance_level": "sequence"}))
        # use_tis=true = off_policy_correction=tis; with another correction named it is refused (rules/core.py)
        if trainer.get("use_tis") is True and trainer.get("off_policy_correction", "none") in ("none", "tis"):
            trainer["use_tis"], trainer["off_policy_correction"] = False, "tis"
            done.append(Rewrite("trainer.use_tis", True, {"trainer.off_policy_correction": "tis"}))
    return done


def announce(rewrites: list[Rewrite]) -> None:
    for rewrite in rewrites:
        log.warning(rewrite.line())


def as_written(errors: list[ConfigError], rewrites: list[Rewrite]) -> list[ConfigError]:
    """Errors about a key a rewrite set name the key the user wrote (trainer.use_tis, not the correction)."""
    if not rewrites:
        return errors
    out = []
    for error in errors:
        for rewrite in rewrites:
            if error.path in rewrite.into and error.path != rewrite.key:
                error = replace(error, path=rewrite.key, value=rewrite.value,
                                hint=error.hint.replace(error.path, rewrite.key))
                break
        out.append(error)
    return out
