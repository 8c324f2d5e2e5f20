"""Regenerate the swe_tiny_smoke task file: every swe_tiny task with K listed edits, one of them correct (a
developer tool, like tiny_build).

    python -m tools.smoke_build            # rewrite data/swe_tiny_smoke/tasks.jsonl
    python -m tools.smoke_build --check    # exit 1 if the shipped file is not what swe_tiny gives

A random tiny model never writes a working tool call, so on a laptop coding-agent RL can only be seen to learn
when each turn is restricted to a few well-formed edits (agent.constrain=choices): the gold patch, and edits
that apply cleanly to the same lines but leave the bug in place (a note above the line, a comment on it);
each command's first line is a shell comment that says which of the three it is. The
CLI really runs the chosen edit as a shell command and the hidden tests really grade it, so rewards differ
within a group. The choices are {"shell": COMMAND}: each CLI runs it through its own shell tool.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from slimecli.swe.builtin import DATA_DIR, task_file
from slimecli.swe.shell_choice import ChoiceError as SmokeError  # a task whose wrong edits cannot be made
from slimecli.swe.shell_choice import apply_command
from slimecli.swe.task import load
from slimecli.swe.workspace import prepare, run_git
from tools.regen import regen_main
from tools.tiny_build import DIFF_FLAGS, render

SET = "swe_tiny_smoke"
OUT = DATA_DIR / SET / "tasks.jsonl"
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


# What each edit does, as the first line of its command (a shell comment, like a commit subject): the
# model chooses an edit by these words, which mean the same in every task, so one step's rewards teach it
# about the next step's tasks. Gold first; the wrong edits in the order wrong_edits makes them.
LABELS = ("# Fix the reported problem", "# Note where the problem starts", "# Mark the changed line as checked")


def first_change(patch: str) -> tuple[str, int, bool]:
    """(file, 0-based line of the base file, whether that line is removed) where the gold patch first differs."""
    path, line = None, None
    for text in patch.splitlines():
        if text.startswith("--- a/"):
            path = text[len("--- a/"):]
        elif (m := _HUNK.match(text)) and path:
            line = int(m.group(1)) - 1
        elif line is not None and text.startswith(" "):
            line += 1
        elif line is not None and text[:1] in "+-" and not text.startswith(("+++", "---")):
            return path or "", line, text.startswith("-")
    raise SmokeError("the gold patch changes no existing file")


def wrong_edits(source: str, line: int, removed: bool) -> list[str]:
    """Two edits of the line the fix changes that keep the code as it was: a note above it, a comment on it."""
    lines = source.splitlines(keepends=True)
    target = lines[min(line, len(lines) - 1)]
    indent = target[: len(target) - len(target.lstrip())]
    note = [*lines[:line], f"{indent}# NOTE: this is where the reported problem starts\n", *lines[line:]]
    on = min(line if removed else max(line - 1, 0), len(lines) - 1)
    body = lines[on].rstrip("\n")
    if not body.strip() or body.rstrip().endswith(("\\", '"""', "'''")):  # nothing to comment on safely
        body_line = f"{indent}# checked: looks right\n"
        commented = [*lines[:on + 1], body_line, *lines[on + 1:]]
    else:
        commented = [*lines[:on], f"{body}  # checked: looks right\n", *lines[on + 1:]]
    return ["".join(note), "".join(commented)]


def smoke_row(row: dict[str, Any], task: Any, home: str) -> dict[str, Any]:
    path, line, removed = first_change(row["patch"])
    with tempfile.TemporaryDirectory(prefix="slimecli-smoke-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        prepare(task, ws)
        source = (ws / path).read_text()
        patches = []
        for text in wrong_edits(source, line, removed):
            (ws / path).write_text(text)
            patches.append(run_git(*DIFF_FLAGS, home=home, cwd=ws, raw=True))
        (ws / path).write_text(source)
    if any(not p or p == row["patch"] for p in patches):
        raise SmokeError(f"{row['instance_id']}: a wrong edit is empty or the gold patch")
    edits = list(zip([row["patch"], *patches], LABELS, strict=True))
    # the gold edit's place differs by task, fixed by the instance id (never by the clock or a random seed)
    shift = int(hashlib.sha256(row["instance_id"].encode()).hexdigest(), 16) % len(edits)
    ordered = edits[shift:] + edits[:shift]
    return {**row, "instance_id": row["instance_id"] + "-smoke",
            "choices": [{"shell": apply_command(p, label)} for p, label in ordered],
            "gold_choice": [p for p, _ in ordered].index(row["patch"])}


def build_rows() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in task_file("swe_tiny").read_text().splitlines()]
    tasks = {t.instance_id: t for t in load(str(task_file("swe_tiny"))).tasks}
    with tempfile.TemporaryDirectory(prefix="slimecli-smoke-home-") as home:
        return [smoke_row(row, tasks[row["instance_id"]], home) for row in rows]


def main(argv: list[str] | None = None) -> int:
    return regen_main("smoke_build", __doc__ or "", OUT, lambda: render(build_rows()), SmokeError, "swe_tiny", argv)


if __name__ == "__main__":
    sys.exit(main())
