"""`slimecli tasks list|check|grade` as a user runs them, on the built-in set and on a task file of one's own."""

from __future__ import annotations

import json

import pytest

from slimecli.swe.builtin import task_file
from tests.helpers import invoke_cli


def builtin_row(instance: str) -> dict:
    return next(r for r in map(json.loads, task_file("swe_tiny").read_text().splitlines())
                if r["instance_id"] == instance)


def test_list_shows_the_builtin_sets_and_a_files_rows():
    proc = invoke_cli("tasks", "list")
    assert proc.returncode == 0 and "builtin:swe_tiny" in proc.stdout and "20 tasks over 5 repos" in proc.stdout
    proc = invoke_cli("tasks", "list", "task.path=builtin:swe_tiny")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 20 and "tiny-lru-004" in proc.stdout


def test_grade_prints_the_reward_dict(tmp_path):
    row = builtin_row("tiny-intervals-002")
    gold, wrong = tmp_path / "gold.diff", tmp_path / "wrong.diff"
    gold.write_text(row["patch"])
    wrong.write_text("diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.md\n"
                     "@@ -0,0 +1 @@\n+looked at it\n")  # applies, fixes nothing
    proc = invoke_cli("tasks", "grade", "task.instance=tiny-intervals-002", "--patch", str(gold))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"resolved": 1, "f2p": 1.0, "p2p": 1.0, "applied": 1, "touched_tests": 0,
                                       "reward": 1.0}
    out = json.loads(invoke_cli("tasks", "grade", "task.instance=tiny-intervals-002", "--patch", str(wrong)).stdout)
    assert out["resolved"] == 0 and out["applied"] == 1


def test_grade_refuses_bad_input_with_exit_2(tmp_path):
    proc = invoke_cli("tasks", "grade", "--patch", str(tmp_path / "x.diff"))
    assert proc.returncode == 2 and "task.instance=ID" in proc.stderr
    proc = invoke_cli("tasks", "grade", "task.instance=tiny-calc-003", "--patch", str(tmp_path / "x.diff"))
    assert proc.returncode == 2 and "--patch: cannot read" in proc.stderr and "Traceback" not in proc.stderr
    proc = invoke_cli("tasks", "grade", "task.instance=tiny-calc-3", "--patch", str(tmp_path / "x.diff"))
    assert proc.returncode == 2 and "did you mean 'tiny-calc-003'?" in proc.stderr


@pytest.mark.slow
def test_check_passes_a_good_task_and_fails_a_broken_one(tmp_path):
    good = builtin_row("tiny-wrap-003")
    broken = {**good, "instance_id": "broken-1", "patch": builtin_row("tiny-calc-001")["patch"]}  # wrong gold patch
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n")
    proc = invoke_cli("tasks", "check", f"task.path={path}", "--json")
    assert proc.returncode == 1, proc.stderr
    results = {r["instance_id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert results["tiny-wrap-003"]["ok"] and not results["broken-1"]["ok"]
    assert {c["name"] for c in results["broken-1"]["checks"] if not c["ok"]} == {"gold"}
    assert "1/2 tasks valid" in proc.stderr
    proc = invoke_cli("tasks", "check", f"task.path={path}", "task.instance=tiny-wrap-003")
    assert proc.returncode == 0 and proc.stdout.startswith("ok   tiny-wrap-003")
