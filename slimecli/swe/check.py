"""`slimecli tasks check`: is a task gradable, and does its grading resist the obvious ways to cheat?

A valid task fails its FAIL_TO_PASS tests at base and passes them with the gold patch, keeps its
PASS_TO_PASS tests passing before and after, and gives nothing for an empty diff, for deleting the tests,
or for rewriting them to pass trivially. The cheating diffs are built from the task alone (its test ids
and the base tree), so every task of any set can be checked the same way.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimecli.swe.git import file_diff as file_diff
from slimecli.swe.grade import GradeReport, Unevaluatable, evaluate, grade, local_sandbox, test_files
from slimecli.swe.rows import SweTask
from slimecli.swe.workspace import WorkspaceError, prepare

if TYPE_CHECKING:
    from slimecli.sandbox.base import Sandbox


@dataclass
class Check:
    name: str
    ok: bool
    why: str = ""


@dataclass
class CheckResult:
    instance_id: str
    checks: list[Check] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def why(self) -> str:
        return "; ".join(f"{c.name}: {c.why}" for c in self.checks if not c.ok)

    def as_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "ok": self.ok, "elapsed_s": round(self.elapsed_s, 3),
                "checks": [{"name": c.name, "ok": c.ok, "why": c.why} for c in self.checks]}


def fake_test_file(node_ids: Sequence[str]) -> str:
    """A test module in which every one of `node_ids` (of one file) exists and passes trivially."""
    tree: dict[str, Any] = {}
    for node in node_ids:
        parts = node.split("[", 1)[0].split("::")[1:]
        param = node[len(node.split("[", 1)[0]) + 1:-1] if "[" in node else None
        if not parts:
            continue
        level = tree
        for cls in parts[:-1]:
            level = level.setdefault(cls, {})
        params = level.setdefault(f"def {parts[-1]}", [])
        if param is not None:
            params.append(param)

    def render(level: dict[str, Any], indent: str, method: bool) -> list[str]:
        out: list[str] = []
        for key, value in level.items():
            if key.startswith("def "):
                if value:
                    out.append(f"{indent}@pytest.mark.parametrize('_p', range({len(value)}), ids={value!r})")
                args = ", ".join([*(["self"] if method else []), *(["_p"] if value else [])])
                out += [f"{indent}{key}({args}):", f"{indent}    assert True", ""]
            else:
                out += [f"{indent}class {key}:", *render(value, indent + "    ", True), ""]
        return out

    return "\n".join(["import pytest", "", "", *render(tree, "", False)]).rstrip() + "\n"


def _base_files(task: SweTask, paths: list[str]) -> dict[str, str | None]:
    """The base's text of each path (None: not there), from a workspace only this check ever touches."""
    tmp = Path(tempfile.mkdtemp(prefix="slimecli-check-"))
    try:
        dest = tmp / "workspace"
        dest.mkdir()
        prepare(task, dest)
        out: dict[str, str | None] = {}
        for path in paths:
            file = dest / path
            out[path] = file.read_text(errors="surrogateescape") if file.is_file() else None
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cheat_diffs(task: SweTask, base: dict[str, str | None]) -> dict[str, str]:
    """"delete_tests": remove every test file the base has; "fake_tests": rewrite every test file (new ones
    too) so that each test id passes trivially."""
    by_file: dict[str, list[str]] = {}
    for node in task.tests:
        by_file.setdefault(node.split("::", 1)[0], []).append(node)
    delete = "".join(file_diff(p, text, None) for p, text in base.items() if text is not None)
    fake = "".join(file_diff(p, base.get(p), fake_test_file(ids)) for p, ids in by_file.items())
    return {"delete_tests": delete, "fake_tests": fake}


def _failing(report: GradeReport, ids: Sequence[str], passing: bool) -> list[str]:
    return [f"{i} ({report.tests.get(i)})" for i in ids if (report.tests.get(i) == "passed") != passing]


async def check_task(task: SweTask, *, sandbox_factory: Callable[[Path], Sandbox] = local_sandbox,
                     budget_s: float = 600.0, test_env: Mapping[str, str] | None = None) -> CheckResult:
    """Every check of one task; a check that cannot be graded fails with its unevaluatable reason."""
    start = time.monotonic()
    result = CheckResult(task.instance_id)
    kwargs: dict[str, Any] = {"sandbox_factory": sandbox_factory, "budget_s": budget_s, "test_env": test_env}

    async def attempt(name: str, diff: str, judge: Callable[[GradeReport], str], run_empty: bool = False) -> None:
        try:
            report = await (evaluate if run_empty else grade)(task, diff, **kwargs)
        except Unevaluatable as exc:
            result.checks.append(Check(name, False, f"unevaluatable:{exc}"))
            return
        why = judge(report)
        result.checks.append(Check(name, not why, why))

    def at_base(r: GradeReport) -> str:
        wrong = _failing(r, task.fail_to_pass, passing=False) + _failing(r, task.pass_to_pass, passing=True)
        return f"F2P should fail and P2P pass at base: {', '.join(wrong)}" if wrong else ""

    def with_gold(r: GradeReport) -> str:
        if not r.applied:
            return f"the gold patch does not apply: {r.error}"
        wrong = _failing(r, task.tests, passing=True)
        touched = " (the gold patch touches test paths, which grading restores)" if r.touched_tests else ""
        return f"should pass with the gold patch: {', '.join(wrong)}{touched}" if wrong else ""

    def zero(r: GradeReport) -> str:
        return f"scored {r.as_dict()} (expected 0)" if r.resolved or r.reward(partial=True) else ""

    def zero_flagged(r: GradeReport) -> str:
        return zero(r) or ("" if r.touched_tests else "the edit to the tests was not noticed (touched_tests 0)")

    await attempt("base", "", at_base, run_empty=True)
    await attempt("gold", task.patch, with_gold)
    await attempt("empty_diff", "", zero)
    paths = test_files(task)
    try:
        base = await asyncio.to_thread(_base_files, task, paths)
    except WorkspaceError as exc:
        result.checks.append(Check("cheats", False, f"unevaluatable:workspace: {exc}"))
    else:
        for name, diff in cheat_diffs(task, base).items():
            if diff:
                await attempt(name, diff, zero_flagged)
            else:
                result.checks.append(Check(name, True, "no test file at base to cheat with"))
    result.elapsed_s = time.monotonic() - start
    return result


async def check_all(tasks: Sequence[SweTask], concurrency: int = 2, *,
                    sandbox_factory: Callable[[Path], Sandbox] = local_sandbox, budget_s: float = 600.0,
                    test_env: Mapping[str, str] | None = None,
                    sandboxes_for: Callable[[SweTask], Callable[[Path], Sandbox]] | None = None) -> list[CheckResult]:
    """check_task on every task, `concurrency` at a time; results in the order of `tasks`.

    `sandboxes_for(task)`: the grading sandboxes of the task's environment (built on first use, in a thread);
    when it raises Unevaluatable the task fails one check, "env", and the others go on."""
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(task: SweTask) -> CheckResult:
        async with limit:
            factory = sandbox_factory
            if sandboxes_for is not None:
                start = time.monotonic()
                try:
                    factory = await asyncio.to_thread(sandboxes_for, task)
                except Unevaluatable as exc:
                    return CheckResult(task.instance_id, [Check("env", False, f"unevaluatable:{exc}")],
                                       time.monotonic() - start)
            return await check_task(task, sandbox_factory=factory, budget_s=budget_s, test_env=test_env)

    return list(await asyncio.gather(*(one(t) for t in tasks)))
