"""An edit offered as a choice (agent.constrain=choices): a shell command that applies a patch, its first line a
label saying what it does. The built-in smoke set (tools/smoke_build.py) and `tasks synth` make choices so."""

from __future__ import annotations

DELIMITER = "SLIMECLI_PATCH"


class ChoiceError(Exception):
    """An edit that cannot be offered as a choice (the message says why)."""


def without_index(patch: str) -> str:
    """The patch without its `index SHA..SHA` lines: git apply does not need them, and the model should choose
    between edits by their code, not by blob hashes."""
    return "".join(line for line in patch.splitlines(keepends=True) if not line.startswith("index "))


def apply_command(patch: str, label: str) -> str:
    """A shell command that applies `patch` in the working directory, its first line saying what it does."""
    patch = without_index(patch)
    if DELIMITER in patch:
        raise ChoiceError(f"the patch contains the here-document delimiter {DELIMITER}")
    return f"{label}\ngit apply <<'{DELIMITER}'\n{patch}{DELIMITER}"
