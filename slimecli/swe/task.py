"""SWE tasks: SWE-bench-compatible rows (plus slimecli's own keys), read and checked line by line.

A bad row is reported with its file, line, field and what was expected, never a traceback; the
caller decides (`task.on_invalid`) whether one bad row stops the run or is skipped and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimecli.swe.datafile import read_rows
from slimecli.swe.formats import FIELDS, FORMATS, detect, to_task_row
from slimecli.swe.rows import BUILTIN_PREFIX as BUILTIN_PREFIX
from slimecli.swe.rows import KNOWN as KNOWN
from slimecli.swe.rows import OPTIONAL_STR as OPTIONAL_STR
from slimecli.swe.rows import REQUIRED as REQUIRED
from slimecli.swe.rows import RowError as RowError
from slimecli.swe.rows import SweTask as SweTask
from slimecli.swe.rows import TaskFileError as TaskFileError
from slimecli.swe.sets import task_file

if TYPE_CHECKING:
    from slimecli.config.groups.task import TaskConfig

def _test_list(row: dict[str, Any], key: str) -> tuple[str, ...] | str:
    """A list of test ids, or a JSON string of one (as the SWE-bench files store them); else the reason."""
    value = row[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return "expected a list of test ids or a JSON string of one"
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return f"expected a list of non-empty test id strings, got {type(value).__name__}"
    return tuple(value)


def parse_row(row: Any, source: str) -> SweTask | list[RowError]:
    if not isinstance(row, dict):
        return [RowError(source, "<row>", f"expected a JSON object, got {type(row).__name__}")]
    errors: list[RowError] = []
    for key in REQUIRED:
        if key not in row:
            errors.append(RowError(source, key, "missing (required)"))
        elif key == "test_patch" and not isinstance(row[key], str):  # "": the tests are in the base already
            errors.append(RowError(source, key, "expected a string (a diff, or empty)"))
        elif key not in ("FAIL_TO_PASS", "PASS_TO_PASS", "test_patch") and not (isinstance(row[key], str)
                                                                               and row[key].strip()):
            errors.append(RowError(source, key, "expected a non-empty string"))
    tests: dict[str, tuple[str, ...]] = {}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if key in row:
            parsed = _test_list(row, key)
            if isinstance(parsed, str):
                errors.append(RowError(source, key, parsed))
            else:
                tests[key] = parsed
    if "FAIL_TO_PASS" in tests and not tests["FAIL_TO_PASS"]:
        errors.append(RowError(source, "FAIL_TO_PASS", "must name at least one test (nothing to grade by)"))
    for key in OPTIONAL_STR:
        if row.get(key) is not None and not isinstance(row[key], str):
            errors.append(RowError(source, key, f"expected a string, got {type(row[key]).__name__}"))
    setup = row.get("setup_commands", [])
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(c, str) for c in setup):
        errors.append(RowError(source, "setup_commands", "expected a list of shell command strings"))
    install = row.get("install", [])
    if isinstance(install, str):
        install = [install]
    if not isinstance(install, list) or not all(isinstance(r, str) and r.strip() for r in install):
        errors.append(RowError(source, "install", "expected a list of pip requirement strings"))
    elif any(r.strip().startswith("-") for r in install):
        errors.append(RowError(source, "install", "expected requirements, not pip options"))
    timeout = row.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        errors.append(RowError(source, "timeout_s", f"expected a number of seconds > 0, got {timeout!r}"))
    if not row.get("workdir") and not row.get("image"):
        errors.append(RowError(source, "workdir", "missing: a task needs a workdir (local git repository or "
                               "builtin:NAME) or an image"))
    if errors:
        return errors
    return SweTask(
        instance_id=row["instance_id"], repo=row["repo"], base_commit=row["base_commit"],
        problem_statement=row["problem_statement"], patch=row["patch"], test_patch=row["test_patch"],
        fail_to_pass=tests["FAIL_TO_PASS"], pass_to_pass=tests["PASS_TO_PASS"], workdir=row.get("workdir"),
        image=row.get("image"), test_cmd=row.get("test_cmd"), setup_commands=tuple(setup), timeout_s=timeout,
        install=tuple(r.strip() for r in install),
        hints_text=row.get("hints_text") or "", version=row.get("version") or "",
        environment_setup_commit=row.get("environment_setup_commit") or "", source=source,
        extra={k: v for k, v in row.items() if k not in KNOWN})


@dataclass
class TaskSet:
    path: str
    tasks: list[SweTask]
    errors: list[RowError]
    layouts: dict[str, int] = field(default_factory=dict)  # the rows of each layout read (task.format)
    unknown_fields: dict[str, int] = field(default_factory=dict)  # fields no layout knows: rows that have each

    def get(self, instance_id: str) -> SweTask | None:
        return next((t for t in self.tasks if t.instance_id == instance_id), None)

    @property
    def ids(self) -> list[str]:
        return [t.instance_id for t in self.tasks]


def resolve_path(path: str) -> Path:
    """`builtin:NAME` -> the task file shipped in the wheel; anything else is a file path."""
    if path.startswith(BUILTIN_PREFIX):
        return task_file(path[len(BUILTIN_PREFIX):])
    p = Path(path).expanduser()
    if not p.exists():
        raise TaskFileError(f"{path}: no such file")
    if not p.is_file():
        raise TaskFileError(f"{path}: not a file")
    return p


def load(path: str, format: str = "auto", repos_dir: str | None = None) -> TaskSet:
    """Every row of a task file (JSONL, or parquet with pyarrow) in any published layout (`format`, see
    slimecli.swe.formats); bad rows are collected (with line and field), not raised."""
    from collections import Counter


    if format not in FORMATS:
        raise TaskFileError(f"task.format={format}: not one of {', '.join(FORMATS)}")
    file = resolve_path(path)
    tasks: list[SweTask] = []
    errors: list[RowError] = []
    seen: dict[str, str] = {}
    layouts: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    for source, row in read_rows(file, path):
        if isinstance(row, RowError):
            errors.append(row)
            continue
        if not isinstance(row, dict):
            errors.append(RowError(source, "<row>", f"expected a JSON object, got {type(row).__name__}"))
            continue
        layout = detect(row) if format == "auto" else format
        if layout is None:
            errors.append(RowError(source, "<row>", f"no known layout has these fields ({', '.join(sorted(row)[:12])})"
                                   f"; set task.format to one of {', '.join(FORMATS[1:])}"))
            continue
        layouts[layout] += 1
        unknown.update(k for k in row if k not in FIELDS[layout])
        mapped, layout_errors = to_task_row(row, layout, source, repos_dir)
        parsed = parse_row(mapped, source)
        if layout_errors or isinstance(parsed, list):  # the layout's own errors first: the rest may follow from them
            errors.extend(layout_errors or (parsed if isinstance(parsed, list) else []))
            continue
        if parsed.instance_id in seen:
            errors.append(RowError(source, "instance_id", f"duplicate {parsed.instance_id!r} (first at "
                                   f"{seen[parsed.instance_id]})"))
            continue
        seen[parsed.instance_id] = source
        tasks.append(parsed)
    if not tasks and not errors:
        errors.append(RowError(f"{path}:1", "<file>", "no tasks in the file"))
    return TaskSet(path, tasks, errors, dict(layouts), dict(sorted(unknown.items())))


def load_for(settings: TaskConfig) -> TaskSet:
    """The task file of a config: task.path read as task.format, repositories found under task.repos_dir."""
    return load(settings.path or "", settings.format, settings.repos_dir)
