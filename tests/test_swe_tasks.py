"""SWE task rows: parsing, row errors with line and field, and the config rules that use them."""

from __future__ import annotations

import json

import pytest

from slimecli.config.errors import ConfigErrors
from slimecli.launch.source_checks import load
from slimecli.swe.task import TaskFileError, parse_row
from slimecli.swe.task import load as load_tasks
from tests.helpers import invoke_cli

ROW = {"instance_id": "x-1", "repo": "me/x", "base_commit": "abc", "problem_statement": "add() is wrong",
       "patch": "diff --git a/x.py b/x.py\n", "test_patch": "diff --git a/t.py b/t.py\n",
       "FAIL_TO_PASS": ["tests/test_x.py::test_add"], "PASS_TO_PASS": ["tests/test_x.py::test_sub"],
       "workdir": "/nowhere"}


def write_rows(path, *rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_a_swe_bench_row_with_json_string_test_lists_parses():
    row = {**ROW, "FAIL_TO_PASS": json.dumps(ROW["FAIL_TO_PASS"]), "PASS_TO_PASS": "[]", "hints_text": "h",
           "version": "1.0", "setup_commands": "pip install -e .", "timeout_s": 30, "created_at": "2024"}
    task = parse_row(row, "f:1")
    assert not isinstance(task, list)
    assert task.fail_to_pass == ("tests/test_x.py::test_add",) and task.pass_to_pass == ()
    assert task.setup_commands == ("pip install -e .",) and task.timeout_s == 30
    assert task.tests == ("tests/test_x.py::test_add",)


@pytest.mark.parametrize(("change", "field", "reason"), [
    ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS", "JSON string"),
    ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS", "at least one test"),
    ({"PASS_TO_PASS": [1]}, "PASS_TO_PASS", "test id strings"),
    ({"base_commit": ""}, "base_commit", "non-empty string"),
    ({"timeout_s": -1}, "timeout_s", "> 0"),
    ({"timeout_s": True}, "timeout_s", "> 0"),
    ({"setup_commands": [1]}, "setup_commands", "list of shell command"),
    ({"workdir": None}, "workdir", "needs a workdir"),
    ({"image": 3}, "image", "expected a string"),
])
def test_each_bad_field_is_named(change, field, reason):
    errors = parse_row({**ROW, **change}, "f:7")
    assert isinstance(errors, list)
    assert any(e.field == field and reason in e.reason and e.source == "f:7" for e in errors), errors


def test_missing_fields_are_all_reported():
    errors = parse_row({"instance_id": "x"}, "f:1")
    assert isinstance(errors, list)
    assert {e.field for e in errors} >= {"repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "workdir"}


def test_file_errors_carry_line_numbers_and_duplicates(tmp_path):
    path = write_rows(tmp_path / "t.jsonl", ROW, "{not json", [1, 2], "", ROW, {**ROW, "instance_id": "x-2"})
    tasks = load_tasks(path)
    assert tasks.ids == ["x-1", "x-2"]
    rendered = [e.render() for e in tasks.errors]
    assert rendered[0].startswith(f"{path}:2: <row>: not valid JSON")
    assert rendered[1] == f"{path}:3: <row>: expected a JSON object, got list"
    assert rendered[2] == f"{path}:5: instance_id: duplicate 'x-1' (first at {path}:1)"
    with pytest.raises(TaskFileError, match="no such file"):
        load_tasks(str(tmp_path / "missing.jsonl"))
    assert load_tasks(write_rows(tmp_path / "empty.jsonl")).errors[0].reason == "no tasks in the file"


def test_config_validate_names_the_line_and_field(tmp_path):
    path = write_rows(tmp_path / "bad.jsonl", ROW, {**ROW, "instance_id": "x-2", "PASS_TO_PASS": 5})
    proc = invoke_cli("config", "validate", "task=swe", f"task.path={path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}:2: PASS_TO_PASS: expected a list of non-empty test id strings, got int" in proc.stderr
    assert "task.on_invalid=skip" in proc.stderr


def test_on_invalid_skip_keeps_the_good_rows(tmp_path):
    path = write_rows(tmp_path / "bad.jsonl", ROW, "{")
    cfg = load(["task=swe", f"task.path={path}", "task.on_invalid=skip"])
    assert cfg.task.on_invalid == "skip"
    with pytest.raises(ConfigErrors, match="no valid task"):
        load(["task=swe", f"task.path={write_rows(tmp_path / 'worse.jsonl', '{')}", "task.on_invalid=skip"])


def test_unknown_instance_gets_a_did_you_mean(tmp_path):
    path = write_rows(tmp_path / "t.jsonl", ROW)
    with pytest.raises(ConfigErrors) as info:
        load(["task=swe", f"task.path={path}", "task.instance=x-l"])
    assert "task.instance: no such instance_id" in str(info.value) and "did you mean 'x-1'?" in str(info.value)


def test_task_swe_is_graded_by_tests(tmp_path):
    path = write_rows(tmp_path / "t.jsonl", ROW)
    assert load(["task=swe", f"task.path={path}"]).reward.name == "swe_tests"
    assert load(["task=swe", f"task.path={path}"]).reward.key == "resolved"
    with pytest.raises(ConfigErrors, match="SWE tasks are graded by their tests"):
        load(["task=swe", f"task.path={path}", "reward=f1"])
    with pytest.raises(ConfigErrors, match="reward=swe_tests grades SWE tasks"):
        load(["reward=swe_tests", "task=quickstart"])
    assert load(["reward=swe_tests"]).task.path == "builtin:swe_tiny"
    with pytest.raises(ConfigErrors, match="add reward.key=reward"):
        load(["task=swe", f"task.path={path}", "reward.partial=true"])
    assert load(["task=swe", f"task.path={path}", "reward.partial=true", "reward.key=reward"]).reward.partial


def test_swe_agent_is_resolved_into_the_config(monkeypatch, tmp_path):
    path = write_rows(tmp_path / "t.jsonl", ROW)
    monkeypatch.setenv("SWE_AGENT", "codex")
    assert load(["task=swe", f"task.path={path}"]).agent.name == "codex"
    assert load([], uses_agent=True).agent.name == "codex"  # `agent run|serve`
    assert load([]).agent.name == "none"
    assert load(["agent=claude_code"], uses_agent=True).agent.name == "claude_code"
