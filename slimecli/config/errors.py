"""Config errors are collected, then reported together: path, value, reason, hint."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConfigError:
    path: str
    value: Any
    reason: str
    hint: str = ""

    def render(self) -> str:
        line = f"{self.path}: {self.reason} (got {self.value!r})"
        return f"{line}\n    hint: {self.hint}" if self.hint else line


class ConfigErrors(Exception):
    """Raised once with every error found; the CLI prints them and exits 2."""

    def __init__(self, errors: Iterable[ConfigError]):
        self.errors = list(errors)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.errors)
        head = f"{n} config error{'s' if n != 1 else ''}:"
        return "\n".join([head] + [f"  - {e.render()}" for e in self.errors])


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "") -> str:
    """A 'did you mean' hint, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean '{prefix}{close[0]}'?" if close else ""


def allowed_hint(word: str, allowed: Iterable[str], prefix: str = "") -> str:
    allowed = list(allowed)
    hint = did_you_mean(str(word), allowed, prefix)
    listing = "allowed: " + ", ".join(allowed)
    return f"{hint} {listing}".strip()
