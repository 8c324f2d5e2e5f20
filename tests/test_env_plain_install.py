"""Environments in an install without the hub libraries (no extra): the built-in environment validates and the
hub kinds are config errors that name the extra to install, exit 2, never a traceback. The interpreter is a venv
linking this one's packages with verifiers, openenv-core, skyrl-gym and reasoning-gym (and what only they bring)
left out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.plain_venv import linked_venv

HUB_LIBRARIES = ("verifiers", "openenv", "skyrl_gym", "skyrl-gym", "reasoning_gym", "reasoning-gym")


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return linked_venv(tmp_path_factory.mktemp("plain") / "venv", HUB_LIBRARIES)


def slimecli(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "slimecli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_the_builtin_environment_needs_no_extra(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import reasoning_gym"], capture_output=True, text=True)
    assert "No module named 'reasoning_gym'" in probe.stderr
    out = slimecli(python, "config", "validate", "+recipe=env_lookup")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("kind,env_id,extra", [("reasoning_gym", "chain_sum", "reasoning-gym"),
                                               ("skyrl_gym", "gsm8k", "skyrl-gym"),
                                               ("verifiers", "some-taskset", "verifiers"),
                                               ("openenv", "echo_env", "openenv")])
def test_a_hub_environment_without_its_library_names_the_extra(python: Path, kind: str, env_id: str,
                                                               extra: str) -> None:
    out = slimecli(python, "config", "validate", f"env={kind}", f"env.id={env_id}", "task=jsonl",
                   f"task.path={ROOT / 'pyproject.toml'}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"slimecli[{extra}]" in out.stderr, out.stderr
