"""Regenerate the swe_tiny task file from the clean repositories and the task specs (a developer tool).

    python -m tools.tiny_build            # rewrite data/swe_tiny/tasks.jsonl
    python -m tools.tiny_build --check    # exit 1 if the shipped file is not what the specs give

data/swe_tiny/spec/<repo>.toml describes each task of repos/<repo>: the edits that inject the bug (or
remove the feature) into the clean tree, the problem statement, the code of the new test file that the
test patch adds (its tests are FAIL_TO_PASS) and the PASS_TO_PASS tests of the repository's own test file.
The base commit is a root commit of the edited tree; the gold patch is `git diff` from it to the clean
tree. Nothing here is random or dated by the clock, so two runs write the same bytes. Never imported at
run time: `slimecli.swe.builtin` rebuilds the base commits from the rows alone.
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from slimecli.swe.builtin import DATA_DIR, commit_tree, repo_files, write_tree
from slimecli.swe.workspace import run_git
from tools.regen import regen_main

SET = "swe_tiny"
SET_DIR = DATA_DIR / SET
CREATED_AT = "2024-01-01T00:00:00Z"
VERSION = "1.0"
F2P_RANGE, P2P_RANGE = (1, 3), (3, 10)
DIFF_FLAGS = ("diff", "--no-color", "--no-ext-diff", "--no-renames", "--full-index", "--src-prefix=a/",
              "--dst-prefix=b/")


class SpecError(Exception):
    """A task spec that cannot give a valid task (the message names the task and what is wrong)."""


def _test_names(code: str, where: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise SpecError(f"{where}: not valid Python ({exc})") from None
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def _apply_edits(clean: dict[str, bytes], edits: list[dict[str, str]], where: str) -> dict[str, bytes]:
    files = dict(clean)
    for edit in edits:
        path, old, new = edit["file"], edit["old"], edit["new"]
        if path not in files:
            raise SpecError(f"{where}: edit of {path}: no such file in the repository")
        text = files[path].decode()
        if text.count(old) != 1:
            raise SpecError(f"{where}: edit of {path}: `old` occurs {text.count(old)} times (must be once): {old!r}")
        files[path] = text.replace(old, new).encode()
    if files == clean:
        raise SpecError(f"{where}: the edits change nothing")
    return files


def _check_count(ids: list[str], bounds: tuple[int, int], what: str, where: str) -> None:
    if not bounds[0] <= len(ids) <= bounds[1]:
        raise SpecError(f"{where}: {len(ids)} {what} tests, expected {bounds[0]} to {bounds[1]}")


def _unique_added_lines(patch: str, base: dict[str, bytes]) -> list[str]:
    """Lines the gold patch adds that the base tree does not already have: what a leak would show."""
    present = {line for data in base.values() for line in data.decode().splitlines()}
    return [line[1:] for line in patch.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip() and line[1:] not in present]


def build_task(git_dir: Path, repo: str, clean: dict[str, bytes], spec: dict[str, Any], home: str) -> dict[str, Any]:
    instance_id = f"tiny-{repo}-{spec['n']:03d}"
    own_tests = f"tests/test_{repo}.py"
    new_tests = f"tests/test_issue_{spec['n']:03d}.py"
    if own_tests not in clean:
        raise SpecError(f"{instance_id}: repos/{repo} has no {own_tests}")
    if new_tests in clean:
        raise SpecError(f"{instance_id}: {new_tests} already exists in repos/{repo}")
    base = _apply_edits(clean, spec["edit"], instance_id)
    test_code = spec["test"].strip("\n") + "\n"
    f2p = [f"{new_tests}::{name}" for name in _test_names(test_code, f"{instance_id}: test")]
    known = set(_test_names(clean[own_tests].decode(), own_tests))
    if missing := [name for name in spec["pass_to_pass"] if name not in known]:
        raise SpecError(f"{instance_id}: pass_to_pass names tests that {own_tests} does not define: {missing}")
    p2p = [f"{own_tests}::{name}" for name in spec["pass_to_pass"]]
    _check_count(f2p, F2P_RANGE, "FAIL_TO_PASS", instance_id)
    _check_count(p2p, P2P_RANGE, "PASS_TO_PASS", instance_id)

    base_tree = write_tree(git_dir, base, home)
    clean_tree = write_tree(git_dir, clean, home)
    tested_tree = write_tree(git_dir, {**base, new_tests: test_code.encode()}, home)
    patch = run_git("--git-dir", str(git_dir), *DIFF_FLAGS, base_tree, clean_tree, home=home, raw=True)
    test_patch = run_git("--git-dir", str(git_dir), *DIFF_FLAGS, base_tree, tested_tree, home=home, raw=True)
    if not _unique_added_lines(patch, base):
        raise SpecError(f"{instance_id}: the gold patch adds no line the base lacks (nothing tells the fix apart)")
    return {
        "instance_id": instance_id,
        "repo": f"slimecli/{SET}-{repo}",
        "base_commit": commit_tree(git_dir, base_tree, home),
        "problem_statement": spec["problem"].strip() + "\n",
        "hints_text": "",
        "created_at": CREATED_AT,
        "version": VERSION,
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "workdir": f"builtin:{repo}",
        "kind": spec["kind"],
    }


def build_rows(set_dir: Path = SET_DIR) -> list[dict[str, Any]]:
    """Every task of every spec file, repositories in name order, tasks in the order of their numbers."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="slimecli-tiny-build-") as tmp:
        home, git_dir = Path(tmp) / "home", Path(tmp) / "scratch.git"
        home.mkdir()
        run_git("init", "-q", "--bare", str(git_dir), home=home)
        for spec_file in sorted((set_dir / "spec").glob("*.toml")):
            spec = tomllib.loads(spec_file.read_text(encoding="utf-8"))
            repo = spec["repo"]
            if repo != spec_file.stem:
                raise SpecError(f"{spec_file.name}: repo = {repo!r}, expected {spec_file.stem!r}")
            clean = repo_files(set_dir / "repos" / repo)
            numbers = [task["n"] for task in spec["task"]]
            if numbers != sorted(set(numbers)):
                raise SpecError(f"{spec_file.name}: task numbers must be unique and increasing, got {numbers}")
            rows.extend(build_task(git_dir, repo, clean, task, str(home)) for task in spec["task"])
    return rows


def render(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    return regen_main("tiny_build", __doc__ or "", SET_DIR / "tasks.jsonl", lambda: render(build_rows()), SpecError, "the specs", argv)


if __name__ == "__main__":
    sys.exit(main())
