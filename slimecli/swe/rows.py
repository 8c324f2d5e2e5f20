"""The shape of a SWE task: the row's keys, the task, a bad row's report and an unreadable file's error.
Every module of the package reads rows through these; its own module so that none of them imports another
to learn what a task is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
OPTIONAL_STR = ("hints_text", "version", "environment_setup_commit", "workdir", "image", "test_cmd", "created_at")
KNOWN = (*REQUIRED, *OPTIONAL_STR, "setup_commands", "timeout_s", "install")
BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class SweTask:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str  # the gold patch: never shown to the agent
    test_patch: str  # adds the FAIL_TO_PASS tests: never shown to the agent, applied last when grading ("": none)
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    workdir: str | None = None  # a local git repository holding base_commit, or builtin:NAME
    image: str | None = None  # container sandboxes
    test_cmd: str | None = None  # None -> pytest with JUnit XML
    setup_commands: tuple[str, ...] = ()
    install: tuple[str, ...] = ()  # more requirements of the task's venv (pip requirement strings)
    timeout_s: float | None = None
    hints_text: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    source: str = ""  # file:line it came from
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys of the row, kept as they were

    @property
    def tests(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.fail_to_pass + self.pass_to_pass))


@dataclass(frozen=True)
class RowError:
    source: str  # file:line
    field: str
    reason: str

    def render(self) -> str:
        return f"{self.source}: {self.field}: {self.reason}"


class TaskFileError(Exception):
    """The task file cannot be read at all (missing, not a file, unknown builtin set)."""
