"""Config errors are collected, then reported together: path, value, reason, hint."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Values and keys are echoed into messages; hostile ones (6000 digits, nested hundreds deep, megabytes of
# text) are shortened so the message stays one readable screen and printing it cannot fail.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 120, 120, 60
MAX_PATH_CHARS = 200


def short_repr(value: Any) -> str:
    """repr(value), shortened; never raises (huge ints, deep nesting, broken __repr__)."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            text = repr(value)
        except ValueError:  # more digits than Python converts to text
            return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
        return text if len(text) <= 60 else f"{text[:25]}...{text[-25:]} ({len(text)} digits)"
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail to render
        return f"<{type(value).__name__}>"


def short_text(text: str, limit: int = MAX_PATH_CHARS) -> str:
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]} ({len(text)} chars)"


NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "NO_VALUE"})()  # a problem with no value to show


@dataclass(frozen=True)
class FieldError:
    """A problem with one field of a config or a request: where, the bad value, what is wrong, a hint."""

    path: str
    value: Any
    reason: str
    hint: str = ""

    def line(self) -> str:
        """One line without the hint: `sampling_params.top_p: must be in (0, 1] (got 1.5)`."""
        text = f"{short_text(self.path)}: {self.reason}"
        return text if self.value is NO_VALUE else f"{text} (got {short_repr(self.value)})"

    def render(self) -> str:
        return f"{self.line()}\n    hint: {self.hint}" if self.hint else self.line()


ConfigError = FieldError  # the config layer's name for it


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
    if len(word) > MAX_PATH_CHARS:  # nothing that long is a typo of a config name
        return ""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean '{prefix}{close[0]}'?" if close else ""


def allowed_hint(word: str, allowed: Iterable[str], prefix: str = "") -> str:
    allowed = list(allowed)
    hint = did_you_mean(str(word), allowed, prefix)
    listing = "allowed: " + ", ".join(allowed)
    return f"{hint} {listing}".strip()
