"""The first hour: the mistakes a newcomer makes on the command line get a message that says what to type
instead, and `plan` shows the whole plan even when a pre-flight check refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import invoke_cli


def error_lines(out) -> list[str]:  # type: ignore[no-untyped-def]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    return [line.strip() for line in out.stderr.splitlines()[1:]]


@pytest.mark.parametrize(("override", "hint"), [
    ("max_steps=10", "did you mean 'trainer.max_steps'?"),  # a key of a group, written without it
    ("trainer.lr=0.1", "did you mean 'optimizer.lr'?"),  # ... or under the wrong group
    ("max_stepz=10", "did you mean 'trainer.max_steps'?"),  # a typo of one
    ("trainr=torch", "did you mean 'trainer'?"),  # a group name misspelt
    ("optimzer.lr=0.1", "did you mean 'optimizer.lr'?"),  # the group misspelt, the key exact
    ("optimzer.lrr=0.1", "did you mean 'optimizer'?"),
    ("seed=1", "did you mean one of 'run.seed', "),  # several keys end so
])
def test_an_unknown_key_points_at_the_key_meant(override: str, hint: str) -> None:
    lines = error_lines(invoke_cli("config", "validate", override))
    key = override.partition("=")[0]
    assert lines[0].startswith(f"- {key}: unknown key") and lines[1].startswith(f"hint: {hint}"), lines


def test_a_misspelt_key_inside_the_right_group_keeps_its_own_hint() -> None:
    lines = error_lines(invoke_cli("config", "validate", "trainer.max_stpes=3"))
    assert lines == ["- trainer.max_stpes: unknown key (got 3)", "hint: did you mean 'trainer.max_steps'?"]


@pytest.mark.parametrize("spec", ["./nope.yaml", "nope.yml", "recipes/nope"])
def test_a_recipe_path_that_does_not_exist_is_named(spec: str) -> None:
    lines = error_lines(invoke_cli("config", "validate", f"+recipe={spec}"))
    assert lines[0] == f"- recipe: recipe file {spec} does not exist (got {spec!r})", lines
    assert "unknown recipe" not in "\n".join(lines)


def test_a_recipe_name_that_does_not_exist_still_lists_the_recipes() -> None:
    lines = error_lines(invoke_cli("config", "validate", "+recipe=swe_agnet"))
    assert lines[0].startswith("- recipe: unknown recipe") and "did you mean 'swe_agent'?" in lines[1]


@pytest.mark.parametrize(("word", "example"), [
    ("trainer", "e.g. trainer=torch (members: megatron, torch)"),
    ("trainer.max_steps", "e.g. trainer.max_steps=VALUE"),
    ("hello", "e.g. trainer=torch, trainer.max_steps=20 or +recipe=opd"),
])
def test_a_bare_word_is_not_an_override(word: str, example: str) -> None:
    lines = error_lines(invoke_cli("config", "show", word))
    assert lines == [f"- {word}: is not an override: use key=value or group=member", f"hint: {example}"]


def test_port_and_run_dir_errors_name_the_field_before_launch(tmp_path: Path) -> None:
    lines = error_lines(invoke_cli("config", "validate", "rollout.port=99999"))
    assert lines == ["- rollout.port: must be a TCP port in 1..65535, or auto (got 99999)"]
    (tmp_path / "taken").write_text("a file")
    for value, why in [("/proc/foo", "is under /proc, a kernel file system"),
                       (str(tmp_path / "taken"), "exists and is a file, not a directory")]:
        for command in (["config", "validate"], ["train"]):
            lines = error_lines(invoke_cli(*command, f"run.dir={value}", "rollout.port=1"))
            assert any(line.startswith(f"- run.dir: {why}") for line in lines), (command, lines)


def test_plan_shows_the_plan_then_the_errors(tmp_path: Path) -> None:
    """A dry run shows everything: the processes, then why they would not start (exit 2)."""
    out = invoke_cli("plan", "run.dir=/proc/foo")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "launch plan for recipe=quickstart (run dir /proc/foo)" in out.stdout and "1. engine-0" in out.stdout
    assert "2. trainer (worker)" in out.stdout
    assert "run.dir: is under /proc" in out.stderr
    as_json = invoke_cli("plan", "run.dir=/proc/foo", "--json")
    assert as_json.returncode == 2 and "run.dir: is under /proc" in as_json.stderr
    assert [p["name"] for p in json.loads(as_json.stdout)] == ["engine-0", "trainer"]


def test_plan_that_passes_exits_0(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on, so the port check passes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = invoke_cli("plan", f"run.root={tmp_path}", f"rollout.port={port}", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["ports"] == [port]
