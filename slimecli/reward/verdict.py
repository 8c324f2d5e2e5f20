"""A judge's verdict: the form it must take (a regex or a JSON schema, sent to the judge as a structured-output
constraint where it has them), the instruction that asks for it, and how its text becomes a reward.

Kept free of HTTP; config/rules/reward.py checks the config a form is made from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from slimecli.config.groups.reward import (
    DEFAULT_RUBRIC,
    DEFAULT_VERDICT_REGEX,
    RUBRIC_PLACEHOLDERS,
    VERDICT_KEY,
    RewardConfig,
)

PASS_WORDS = frozenset({"pass", "passed", "yes", "true", "correct", "accept", "accepted", "1"})
FAIL_WORDS = frozenset({"fail", "failed", "no", "false", "incorrect", "reject", "rejected", "0"})


class VerdictError(ValueError):
    """The judge's text holds no verdict of the configured form."""


@dataclass(frozen=True)
class VerdictForm:
    verdict: str  # pass_fail | score
    regex: str | None  # exactly one of regex and schema is set
    schema: str | None  # compact JSON text
    score_max: float = 10.0

    @property
    def constraint(self) -> tuple[str, str]:
        """(kind, text) of the structured-output constraint: ("regex", ...) or ("json_schema", ...)."""
        return ("regex", self.regex) if self.regex is not None else ("json_schema", str(self.schema))

    def instruction(self) -> str:
        """What the rubric's {instruction} asks for: the verdict's form in words."""
        what = ("PASS if the answer is acceptable, FAIL if it is not" if self.verdict == "pass_fail"
                else f"a score from 0 to {self.score_max:g} (higher is better)")
        if self.schema is not None:
            return f"Reply with only a JSON object following this schema, its \"{VERDICT_KEY}\" being {what}: {self.schema}"
        if self.regex == DEFAULT_VERDICT_REGEX[self.verdict]:
            return f"Reply with only {what}."
        return f"Give {what}, in a reply matching the regular expression {self.regex}"

    def parse(self, text: str) -> float:
        """The reward a verdict text stands for; VerdictError when it holds none."""
        raw = self._verdict_text(text) if self.regex is not None else self._schema_verdict(text)
        return self._value(raw)

    def _verdict_text(self, text: str) -> Any:
        pattern = re.compile(str(self.regex))
        match = pattern.fullmatch(text.strip())
        if match is None:  # a judge without the constraint may wrap its verdict in other words: the last one counts
            found = list(pattern.finditer(text))
            if not found:
                raise VerdictError(f"no match of the verdict regex in {_clip(text)}")
            match = found[-1]
        if "verdict" in pattern.groupindex:
            return match.group("verdict")
        return match.group(1) if pattern.groups else match.group(0)

    def _schema_verdict(self, text: str) -> Any:
        start, end = text.find("{"), text.rfind("}")
        try:
            data = json.loads(text[start:end + 1]) if 0 <= start < end else json.loads(text)
        except ValueError:
            raise VerdictError(f"the verdict is not JSON: {_clip(text)}") from None
        if not isinstance(data, dict) or VERDICT_KEY not in data:
            raise VerdictError(f"the JSON verdict has no {VERDICT_KEY!r}: {_clip(text)}")
        return data[VERDICT_KEY]

    def _value(self, raw: Any) -> float:
        if self.verdict == "pass_fail":
            if isinstance(raw, bool):
                return 1.0 if raw else 0.0
            word = str(raw).strip().strip(".!\"'`*").lower()
            if word in PASS_WORDS:
                return 1.0
            if word in FAIL_WORDS:
                return 0.0
            raise VerdictError(f"verdict {_clip(str(raw))} is neither pass nor fail")
        try:
            if isinstance(raw, bool):
                raise TypeError(raw)
            score = float(raw)
        except (TypeError, ValueError):
            raise VerdictError(f"verdict {_clip(str(raw))} is not a number") from None
        if not 0 <= score <= self.score_max:  # NaN fails too
            raise VerdictError(f"score {score:g} is outside 0..reward.score_max={self.score_max:g}")
        return score / self.score_max


def _clip(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def compile_form(cfg: RewardConfig) -> VerdictForm:
    """The verdict form of a reward config (config/rules/reward.py has checked it: a bad one raises ValueError)."""
    if cfg.verdict_schema is not None:
        return VerdictForm(cfg.verdict, None, json.dumps(json.loads(cfg.verdict_schema), separators=(",", ":")),
                           cfg.score_max)
    regex = DEFAULT_VERDICT_REGEX[cfg.verdict] if cfg.verdict_regex is None else cfg.verdict_regex
    re.compile(regex)
    return VerdictForm(cfg.verdict, regex, None, cfg.score_max)


def rubric_of(cfg: RewardConfig) -> str:
    return DEFAULT_RUBRIC if cfg.rubric is None else cfg.rubric


def render(rubric: str, form: VerdictForm, prompt: Any, response: Any, label: Any) -> str:
    """The judge's prompt: the rubric with its placeholders filled in (other braces are left as written)."""
    values = {"{prompt}": _text(prompt), "{response}": _text(response), "{label}": _text(label),
              "{instruction}": form.instruction()}
    return re.sub("|".join(re.escape(p) for p in RUBRIC_PLACEHOLDERS), lambda m: values[m.group(0)], rubric)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):  # chat messages
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
