"""Listed edits for `agent.constrain=choices` (`tasks synth --choices N`): the gold patch and N-1 wrong edits.

A wrong edit is another candidate bug of the same function (a line the failing tests run), made on top of the
task's base: it changes the code near the bug and leaves the bug in place, so the hidden tests still fail
(synthesis grades every wrong edit and drops a task whose wrong edit resolves it). The rows then train like
`builtin:swe_tiny_smoke`: a random tiny policy can only be seen to learn when its first turn is one of a few
well-formed edits. As there, each command's first line says which edit it is, in words that mean the same in
every task (the fix, or a change elsewhere), so one step's rewards teach the policy about the next step's tasks.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from slimecli.swe.check import file_diff
from slimecli.swe.shell_choice import apply_command
from slimecli.swe.synth.mutate import Mutation, find

# gold first, then the wrong edits; each starts with its own word, so the choices part at one token
LABELS = ("# Fix the reported problem", "# Change another line of the function",
          "# Rewrite a different line of the function", "# Edit one more line of the function")
MAX_CHOICES = len(LABELS)


def _on_top(kept: Mutation, other: Mutation, mutated: bytes) -> bytes | None:
    """`other` (found in the clean file) applied to the file `kept` broke, when their ranges do not touch."""
    if other.end <= kept.start:
        start = other.start
    elif other.start >= kept.end:
        start = other.start + len(kept.new) - (kept.end - kept.start)
    else:
        return None
    moved = Mutation(other.path, other.function, other.line, other.kind, start,
                     start + other.end - other.start, other.new)
    return moved.apply(mutated)


def wrong_files(kept: Mutation, original: bytes, mutated: bytes, lines: dict[int, set[str]],
                failing: set[str], count: int, seed: int) -> list[bytes]:
    """Up to `count` distinct versions of the broken file, each with one more edit of the same function on a
    line the failing tests run (else of another function of the file that they run); seeded order."""
    rng = random.Random(f"{seed}:{kept.key}:choices")
    run = [m for m in find(kept.path, original) if m.key != kept.key and lines.get(m.line, set()) & failing]
    same = [m for m in run if m.function == kept.function]
    others = [m for m in run if m.function != kept.function]
    rng.shuffle(same)
    rng.shuffle(others)
    out: list[bytes] = []
    for m in same + others:
        text = _on_top(kept, m, mutated)
        if text is not None and text != mutated and text not in out:
            out.append(text)
            if len(out) == count:
                break
    return out


def choice_fields(instance_id: str, path: str, mutated: bytes, patch: str, wrong: list[bytes]) -> dict[str, Any]:
    """The row's `choices` ({"shell": a command that applies one edit}) and `gold_choice` (the fix's index)."""
    base = mutated.decode("utf-8", "surrogateescape")
    edits = [patch, *(file_diff(path, base, w.decode("utf-8", "surrogateescape")) for w in wrong)]
    labelled = list(zip(edits, LABELS, strict=False))
    shift = int(hashlib.sha256(instance_id.encode()).hexdigest(), 16) % len(labelled)  # by the id, never random
    ordered = labelled[shift:] + labelled[:shift]
    return {"choices": [{"shell": apply_command(p, label)} for p, label in ordered],
            "gold_choice": [p for p, _ in ordered].index(patch)}


def wrong_patches(row: dict[str, Any]) -> list[str]:
    """The patches of a row's wrong choices (what synthesis grades to show none of them resolves the task)."""
    out = []
    for i, choice in enumerate(row.get("choices") or []):
        if i == row.get("gold_choice"):
            continue
        body = choice["shell"].split("\n", 2)[2]  # after the label and the `git apply <<'DELIM'` line
        out.append(body[:body.rindex("\n") + 1])
    return out
