"""`slimecli env list|check|run` as a user runs them (fresh interpreters): what is installed, one environment
reset and stepped, a few episodes against the embedded tiny engine, and failures that name their stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, host_processes_with, run_cli

FLAKY = '''
from slimecli.env.protocol import Observation, StepResult


class _Base:
    def tasks(self):
        return [{"id": "t0"}]

    async def reset(self, task):
        return Observation([{"role": "user", "content": "hi"}])

    async def step(self, action):
        return StepResult(reward=1.0, done=True)

    async def close(self):
        pass


class BadReset(_Base):
    async def reset(self, task):
        raise RuntimeError("the database is down")


class BadStep(_Base):
    async def step(self, action):
        return StepResult(reward=float("nan"), done=True)
'''


def _no_traceback(out: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in out.stdout + out.stderr, out.stderr


def test_help_says_rl_environments_not_task_environments():
    out = run_cli("env", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "RL environments" in text and "slimecli tasks env" in text


def test_list_shows_lookup_from_slimecli_and_every_kind():
    out = run_cli("env", "list")
    assert out.returncode == 0, out.stderr
    assert any(line.split() == ["lookup", "slimecli"] for line in out.stdout.splitlines()), out.stdout
    for kind in ("native", "verifiers", "openenv", "skyrl_gym", "reasoning_gym"):
        assert any(line.startswith(kind) for line in out.stdout.splitlines()), (kind, out.stdout)
    assert run_cli("env", "list", "nativ").returncode == 2


def test_list_names_the_extra_of_a_missing_library_without_importing_torch():
    code = ("import sys\n"
            "sys.modules['openenv'] = None  # as if openenv-core were not installed\n"
            "from slimecli.cli.app import app\n"
            "for argv in (['env', 'list', 'native'], ['env', 'list', 'openenv'], ['env', '--help']):\n"
            "    try:\n"
            "        app(argv)\n"
            "    except SystemExit as e:\n"
            "        assert not e.code, (argv, e.code)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print('NO_TORCH')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "NO_TORCH" in out.stdout, out.stderr
    assert "openenv: not installed (pip install 'slimecli[openenv]')" in out.stdout


def test_check_lookup_shows_tools_and_a_reward():
    out = run_cli("env", "check", "env=native", "env.id=lookup")
    assert out.returncode == 0, out.stderr
    assert "tools: lookup, answer" in out.stdout
    assert "step (an empty reply): reward 0, done True" in out.stdout
    assert "user: What is the secret word?" in out.stdout
    timings = next(line for line in out.stdout.splitlines() if line.startswith("timings:"))
    assert all(stage in timings for stage in ("load", "reset", "step", "close"))


def test_check_typo_is_a_config_error_with_did_you_mean():
    out = run_cli("env", "check", "env=native", "env.id=lokup")
    assert out.returncode == 2
    assert "did you mean 'lookup'" in out.stderr
    _no_traceback(out)
    none = run_cli("env", "check")
    assert none.returncode == 2 and "env=KIND env.id=ID" in none.stderr


def test_check_names_the_failing_stage(tmp_path: Path):
    (tmp_path / "flaky_envs.py").write_text(FLAKY)
    by_file = run_cli("env", "check", "env=native", f"env.id={tmp_path / 'flaky_envs.py'}:BadReset")
    assert by_file.returncode == 1, by_file.stderr
    assert "reset failed: RuntimeError: the database is down" in by_file.stderr
    _no_traceback(by_file)
    by_module = run_cli("env", "check", "env=native", "env.id=flaky_envs:BadStep",
                        env={"PYTHONPATH": str(tmp_path)})
    assert by_module.returncode == 1, by_module.stderr
    assert "step failed: step reward is nan" in by_module.stderr and "tools: none" in by_module.stdout
    _no_traceback(by_module)


@pytest.mark.slow
def test_run_plays_episodes_on_the_embedded_engine(tmp_path: Path):
    out_file = tmp_path / "episodes.jsonl"
    out = run_cli("env", "run", "env=native", "env.id=lookup", "--episodes", "2", "--out", str(out_file),
                  env={"TMPDIR": str(tmp_path)}, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("── episode ") == 2, out.stdout
    assert "── episode 1/2 · lookup" in out.stdout and "turn 1 policy" in out.stdout
    assert "summary: 2 episode(s) · mean reward" in out.stdout
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["episode"] for r in rows] == [1, 2]
    for row in rows:
        kinds = [next(iter(e)) for e in row["events"]]
        assert kinds[:2] == ["reset", "policy"], kinds
        assert row["source"] == "lookup" and row["turns"] >= 1
    assert host_processes_with(str(tmp_path)) == []  # the engine it started is gone
    assert not list(tmp_path.glob("slimecli-engine-*"))  # and its config and log with it
