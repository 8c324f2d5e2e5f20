"""A kept bug as a task row in slimecli's layout (SWE-bench's fields, plus `workdir`).

Hidden tests follow SWE-bench's convention as SWE-smith applies it to made bugs: the test files holding a
FAIL_TO_PASS test are not in the base commit, and `test_patch` adds them back (whole) before grading, so the
agent cannot read the tests it is graded by. PASS_TO_PASS are the other tests of those runs that passed before
and after the break (sampled up to a bound). The problem statement is what a user running the suite would
see: the failing tests' names and their crash messages; it never shows the diff or names the broken function.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from slimecli.swe.check import file_diff
from slimecli.swe.synth.mutate import Mutation
from slimecli.swe.synth.source import TaskRepo

MAX_LISTED = 5  # failing tests quoted in a problem statement
MAX_MESSAGE = 600  # characters of one test's message


@dataclass
class Kept:
    """A candidate that broke 1..K passing tests and nothing else."""

    mutation: Mutation
    original: bytes
    mutated: bytes
    fail_to_pass: list[str]
    pass_to_pass: list[str]  # every candidate, before sampling
    messages: dict[str, str]  # F2P node id -> its failure message


def test_file(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def problem_statement(project: str, failing: list[str], messages: dict[str, str]) -> str:
    lines = [f"Some of {project}'s tests fail on this checkout. Running them shows:", ""]
    for node in failing[:MAX_LISTED]:
        message = messages.get(node, "").strip() or "(no message)"
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + " ..."
        lines += [f"FAILED {node}", *("    " + line for line in message.splitlines()), ""]
    if len(failing) > MAX_LISTED:
        lines += [f"... and {len(failing) - MAX_LISTED} more failing test(s).", ""]
    lines.append("These tests are not in the repository. Fix the library code so that they pass; "
                 "do not change its other behaviour.")
    return "\n".join(lines) + "\n"


def build(kept: Kept, *, project: str, version: str, repo: TaskRepo, clean_tree: str, max_p2p: int, seed: int,
          workdir: str) -> dict[str, Any]:
    m = kept.mutation
    instance_id = f"{project}.synth.{m.key}"
    hidden = sorted({test_file(t) for t in kept.fail_to_pass})
    rng = random.Random(f"{seed}:{instance_id}")
    p2p = sorted(kept.pass_to_pass)
    if len(p2p) > max_p2p:
        p2p = sorted(rng.sample(p2p, max_p2p))
    base = repo.commit(clean_tree, {m.path: kept.mutated}, hidden, f"{project} {version}".strip(),
                       f"refs/tasks/{instance_id}")
    test_patch = "".join(file_diff(p, None, repo.read(clean_tree, p).decode("utf-8", "surrogateescape"))
                         for p in hidden)
    patch = file_diff(m.path, kept.mutated.decode("utf-8", "surrogateescape"),
                      kept.original.decode("utf-8", "surrogateescape"))
    failing = sorted(kept.fail_to_pass)
    return {"instance_id": instance_id, "repo": project, "base_commit": base,
            "problem_statement": problem_statement(project, failing, kept.messages),
            "patch": patch, "test_patch": test_patch, "FAIL_TO_PASS": failing, "PASS_TO_PASS": p2p,
            "version": version, "workdir": workdir,
            "synth": {"kind": m.kind, "file": m.path, "function": m.function, "line": m.line}}
