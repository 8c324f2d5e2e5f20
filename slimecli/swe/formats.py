"""The published SWE dataset layouts, mapped onto slimecli's task row as they are published.

  slimecli   SWE-bench's fields plus `workdir` / `image` / `install` / ... (what `tasks synth` writes)
  swebench   SWE-bench, -Lite, -Verified: FAIL_TO_PASS / PASS_TO_PASS as JSON strings; no image field, so the
             harness's eval image name (swebench/sweb.eval.x86_64.<id, "__" as "_1776_">:latest) is filled in
  swegym     SWE-Gym: SWE-bench's fields, the test lists as lists, no environment_setup_commit
  swesmith   SWE-smith: `patch` is the diff that *introduces* the bug, `image_name` its image, `repo`
             "swesmith/owner__name.commit"; the instance's branch holds the bug (its head commit only removes
             the failing tests' files), so the base is that branch's parent and the gold patch the bug reversed
  r2egym     R2E-Gym (-Lite, -Subset): no test lists; the fix is `parsed_commit_content` (rendered without its
             test files), the tests are `execution_result_content`'s files (added under r2e_tests/), FAIL_TO_PASS
             are the tests that pass after the fix (`expected_output_json`) and not before (its old-commit run)

Rows name their repository, not a checkout: with task.repos_dir set, `repo` is found there as owner__name,
owner/name or name (SWE-smith: its mirror's name too), and becomes the row's workdir.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slimecli.swe.git import file_diff
from slimecli.swe.rows import KNOWN, RowError

FORMATS = ("auto", "slimecli", "swebench", "swegym", "swesmith", "r2egym")
SWEBENCH = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "hints_text",
            "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit", "difficulty")
FIELDS: dict[str, frozenset[str]] = {
    "slimecli": frozenset((*KNOWN, "synth", "difficulty")),
    "swebench": frozenset(SWEBENCH),
    "swegym": frozenset(SWEBENCH),
    "swesmith": frozenset(("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "created_at",
                           "image_name", "base_commit", "problem_statement")),
    "r2egym": frozenset(("commit_hash", "docker_image", "execution_result_content", "expected_output_json",
                         "modified_entity_summaries", "modified_files", "num_non_test_files",
                         "num_non_test_func_methods", "num_non_test_lines", "parsed_commit_content",
                         "problem_statement", "prompt", "relevant_files", "repo_name")),
}
R2E_TESTS = "r2e_tests"


def detect(row: dict[str, Any]) -> str | None:
    """The layout of one row, from the fields that set it apart; None when it fits none."""
    keys = set(row)
    if {"docker_image", "commit_hash", "repo_name"} <= keys:
        return "r2egym"
    if "image_name" in keys and "test_patch" not in keys and {"instance_id", "patch"} <= keys:
        return "swesmith"
    if "workdir" in keys or "image" in keys:
        return "slimecli"
    if {"instance_id", "repo", "base_commit", "test_patch"} <= keys:
        if isinstance(row.get("FAIL_TO_PASS"), list) and "environment_setup_commit" not in keys:
            return "swegym"
        return "swebench"
    return None


def mirror(repos_dir: str, names: list[str]) -> Path | None:
    for name in names:
        owner, _, short = name.partition("/")
        for candidate in (f"{owner}__{short}" if short else name, name, short or name):
            path = Path(repos_dir).expanduser() / candidate
            if path.is_dir():
                return path
    return None


def _workdir(row: dict[str, Any], out: dict[str, Any], source: str, repos_dir: str | None, names: list[str],
             errors: list[RowError]) -> None:
    if out.get("workdir") or not repos_dir:
        return
    found = mirror(repos_dir, names)
    if found is None:
        errors.append(RowError(source, "repo", f"no mirror of {names[0]!r} under task.repos_dir={repos_dir} "
                               "(looked for owner__name, owner/name and name)"))
    else:
        out["workdir"] = str(found)


def swebench_image(instance_id: str) -> str:
    return f"swebench/sweb.eval.x86_64.{instance_id.lower().replace('__', '_1776_')}:latest"


def _swebench(row: dict[str, Any], source: str, repos_dir: str | None, errors: list[RowError]) -> dict[str, Any]:
    out = dict(row)
    if isinstance(row.get("instance_id"), str):
        out.setdefault("image", swebench_image(row["instance_id"]))
    repo = row.get("repo")
    if isinstance(repo, str):
        _workdir(row, out, source, repos_dir, [repo], errors)
    return out


def reverse_patch(diff: str) -> str:
    """The diff that undoes `diff` (unified, git style), without a repository."""
    out = []
    minus: str | None = None  # the "--- " line waiting for its "+++ "
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
            out.append(f"diff --git a/{m.group(2)} b/{m.group(1)}\n" if m else line)
        elif line.startswith("--- "):
            minus = line[4:]
        elif line.startswith("+++ ") and minus is not None:
            plus = line[4:]
            out.append("--- " + (plus.replace("b/", "a/", 1) if plus.startswith("b/") else plus))
            out.append("+++ " + (minus.replace("a/", "b/", 1) if minus.startswith("a/") else minus))
            minus = None
        elif line.startswith("@@"):
            out.append(re.sub(r"^@@ -(\S+) \+(\S+) @@", r"@@ -\2 +\1 @@", line))
        elif line.startswith("new file mode"):
            out.append(line.replace("new file mode", "deleted file mode", 1))
        elif line.startswith("deleted file mode"):
            out.append(line.replace("deleted file mode", "new file mode", 1))
        elif line.startswith("index "):
            m = re.match(r"index (\w+)\.\.(\w+)(.*)", line, re.S)
            out.append(f"index {m.group(2)}..{m.group(1)}{m.group(3)}" if m else line)
        elif line.startswith("-"):
            out.append("+" + line[1:])
        elif line.startswith("+"):
            out.append("-" + line[1:])
        else:
            out.append(line)
    # a hunk lists removed lines before added ones: swap each run of -/+ back into that order
    fixed: list[str] = []
    i = 0
    while i < len(out):
        if out[i].startswith(("+", "-")) and not out[i].startswith(("+++ ", "--- ")):
            j = i
            while j < len(out) and out[j].startswith(("+", "-")) and not out[j].startswith(("+++ ", "--- ")):
                j += 1
            run = out[i:j]
            fixed += [x for x in run if x.startswith("-")] + [x for x in run if x.startswith("+")]
            i = j
        else:
            fixed.append(out[i])
            i += 1
    return "".join(fixed)


def _swesmith(row: dict[str, Any], source: str, repos_dir: str | None, errors: list[RowError]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in ("image_name", "patch", "base_commit")}
    if isinstance(row.get("patch"), str):
        out["patch"] = reverse_patch(row["patch"])
    image = row.get("image_name")
    if isinstance(image, str) and image:
        out["image"] = image if "/" in image else f"jyangballin/{image.replace('__', '_1776_')}:latest"
    iid = row.get("instance_id")
    out["base_commit"] = f"{iid}~1" if isinstance(iid, str) else None
    out["test_patch"] = ""  # the failing tests are in the base (the branch's parent); grading restores them
    out.setdefault("PASS_TO_PASS", [])
    repo = row.get("repo")
    if isinstance(repo, str):
        short = repo.split("/", 1)[-1]  # owner__name.commit
        out["repo"] = short.rsplit(".", 1)[0].replace("__", "/", 1)
        _workdir(row, out, source, repos_dir, [short, out["repo"]], errors)
    return out


def _json_field(row: dict[str, Any], key: str, source: str, errors: list[RowError]) -> Any:
    value = row.get(key)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            errors.append(RowError(source, key, f"not valid JSON ({exc})"))
            return None
    return value


def _r2e_patch(parsed: dict[str, Any]) -> str:
    """The fix's non-test Python files, rendered the way R2E-Gym renders a parsed commit."""
    out = []
    for fd in parsed.get("file_diffs") or []:
        path = fd["header"]["file"]["path"]
        parts = path.split("/")
        name = parts[-1]
        if not path.endswith(".py") or name.startswith("test_") or name.endswith("_test.py") \
                or {"tests", "test", "Tests", "Test"} & set(parts[:-1]):
            continue
        text = f"diff --git a/{path} b/{path}\n"
        if fd["header"].get("misc_line"):
            text += fd["header"]["misc_line"] + "\n"
        if fd.get("index_line"):
            il = fd["index_line"]
            text += f"index {il['old_commit_hash']}..{il['new_commit_hash']}{' ' + il['mode'] if il.get('mode') else ''}\n"
        if fd.get("minus_file") and fd.get("plus_file"):
            text += f"--- {fd['minus_file']['path']}\n+++ {fd['plus_file']['path']}\n"
        for hunk in fd.get("hunks") or []:
            d = hunk["descriptor"]

            def rng(r: dict[str, Any]) -> str:
                return f"{r['start']}" if r.get("length") is None else f"{r['start']},{r['length']}"

            text += f"@@ -{rng(d['old_range'])} +{rng(d['new_range'])} @@" + (f" {d['section']}" if d.get("section") else "") + "\n"
            marks = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}
            text += "".join(f"{marks[ln['type']]}{ln['content']}\n" for ln in hunk["line_group"]["all_lines"])
        out.append(text)
    return "".join(out)


def _summary(log: str) -> dict[str, str]:
    """pytest -rA's short summary: node id -> PASSED / FAILED / ERROR."""
    found: dict[str, str] = {}
    for line in re.sub(r"\x1b\[[0-9;]*m", "", log or "").splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+::\S+)", line.strip())
        if m:
            found[m.group(2)] = "PASSED" if m.group(1) in ("PASSED", "XFAIL", "XPASS") else m.group(1)
    return found


def _r2egym(row: dict[str, Any], source: str, repos_dir: str | None, errors: list[RowError]) -> dict[str, Any]:
    out: dict[str, Any] = {"repo": row.get("repo_name"), "problem_statement": row.get("problem_statement"),
                           "image": row.get("docker_image")}
    statement = row.get("problem_statement")
    if isinstance(statement, str):
        m = re.search(r"\[ISSUE\](.*)\[/ISSUE\]", statement, re.S)
        out["problem_statement"] = m.group(1).strip() if m else statement
    commit = row.get("commit_hash")
    parsed = _json_field(row, "parsed_commit_content", source, errors) or {}
    execution = _json_field(row, "execution_result_content", source, errors) or {}
    expected = _json_field(row, "expected_output_json", source, errors)
    if isinstance(commit, str):
        out["instance_id"] = f"{row.get('repo_name')}-{commit}"
        out["base_commit"] = parsed.get("old_commit_hash") or f"{commit}^"
    try:
        out["patch"] = _r2e_patch(parsed)
    except (KeyError, TypeError) as exc:
        errors.append(RowError(source, "parsed_commit_content", f"not a parsed commit (missing {exc})"))
    names, codes = execution.get("test_file_names") or [], execution.get("test_file_codes") or []
    if len(names) != len(codes) or not names:
        errors.append(RowError(source, "execution_result_content", "expected test_file_names and test_file_codes "
                               "of the same, non-zero length"))
    paths = [n if "/" in n else f"{R2E_TESTS}/{n}" for n in names]
    out["test_patch"] = "".join(file_diff(p, None, c) for p, c in zip(paths, codes, strict=False))
    if not isinstance(expected, dict) and "expected_output_json" not in {e.field for e in errors}:
        errors.append(RowError(source, "expected_output_json", "expected a JSON object of test -> status"))
    if not isinstance(expected, dict):
        expected = {}
    after, before = _summary(execution.get("new_commit_res_stdout", "")), _summary(
        execution.get("old_commit_res_stdout", ""))
    wanted = {k.split(" - ")[0] for k, v in expected.items() if v == "PASSED"}
    node_of = {node.split("::", 1)[1].replace("::", "."): node for node in {**before, **after}}
    default = paths[0] if paths else f"{R2E_TESTS}/test_1.py"
    nodes = {key: node_of.get(key, f"{default}::{key.replace('.', '::')}") for key in sorted(wanted)}
    out["FAIL_TO_PASS"] = [n for k, n in nodes.items() if before.get(n) != "PASSED"]
    out["PASS_TO_PASS"] = [n for k, n in nodes.items() if before.get(n) == "PASSED"]
    names_for_mirror = [str(row.get("repo_name"))]
    _workdir(row, out, source, repos_dir, names_for_mirror, errors)
    return out


def _slimecli(row: dict[str, Any], source: str, repos_dir: str | None, errors: list[RowError]) -> dict[str, Any]:
    out = dict(row)
    if isinstance(row.get("repo"), str) and not row.get("image"):
        _workdir(row, out, source, repos_dir, [row["repo"]], errors)
    return out


MAPPERS: dict[str, Callable[[dict[str, Any], str, str | None, list[RowError]], dict[str, Any]]] = {
    "slimecli": _slimecli,
    "swebench": _swebench,
    "swegym": _swebench,
    "swesmith": _swesmith,
    "r2egym": _r2egym,
}


def to_task_row(row: dict[str, Any], layout: str, source: str, repos_dir: str | None) -> tuple[dict[str, Any],
                                                                                                 list[RowError]]:
    """The row in slimecli's layout, and what is wrong with its layout's own fields."""
    errors: list[RowError] = []
    return MAPPERS[layout](row, source, repos_dir, errors), errors
