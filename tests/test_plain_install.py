"""Every command works in the install a user has: a non-editable `pip install .` with no extras
(tests/helpers/plain_venv.py), run from a directory that is not the checkout.

Each command and sub-command of the `--help` tree shows its help and runs a real, small invocation
(tests/helpers/plain_commands.py: `tasks synth` on the shipped sdist, `tasks check`, `tasks stats`, LoRA
training, `eval`, `report`, `agent run` with a stand-in CLI, the servers until they serve): it works, or exits 2
with one line naming the extra to install; never a traceback. A command added to the tree without an invocation
fails here. Each extra's feature, without it, names the extra."""

from __future__ import annotations

import json
import re
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.cli_tree import command_tree, leaves
from tests.helpers.plain_commands import (
    SERVER_EXITS,
    Result,
    Workspace,
    extra_probes,
    help_of,
    invocations,
    run_all,
    run_one,
)

pytestmark = pytest.mark.slow

EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.fixture(scope="module")
def slimecli(plain_python: Path) -> Path:
    return plain_python.parent / "slimecli"


@pytest.fixture(scope="module")
def workspace(plain_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("plain-commands"), plain_python)


@pytest.fixture(scope="module")
def tree(slimecli: Path, workspace: Workspace) -> dict[tuple[str, ...], list[str]]:
    return command_tree(help_of(slimecli, workspace.root))


@pytest.fixture(scope="module")
def results(slimecli: Path, workspace: Workspace) -> dict[tuple[str, ...], list[Result]]:
    return run_all(slimecli, workspace)


def shown(result: Result) -> str:
    return f"slimecli {' '.join(result.invocation.args)} -> exit {result.returncode}:\n{result.output[-4000:]}"


def test_the_install_is_plain(plain_python: Path, workspace: Workspace) -> None:
    import subprocess

    code = "import importlib.util as u, slimecli; print(slimecli.__file__); " \
           "print([m for m in ('pytest', 'pyarrow', 'megatron', 'wandb', 'verifiers') if u.find_spec(m)])"
    out = subprocess.run([str(plain_python), "-c", code], capture_output=True, text=True, cwd=workspace.root)
    installed, extras = out.stdout.splitlines()
    assert "site-packages" in installed and not installed.startswith(str(ROOT)), installed  # not the checkout
    assert extras == "[]"


def test_the_wheel_ships_the_config_tree(plain_python: Path) -> None:
    (wheel,) = plain_python.parents[2].glob("wheel/slimecli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"slimecli/_conf/config.yaml", "slimecli/_conf/optimizer/stateless_adam.yaml",
            "slimecli/_recipes/quickstart.yaml", "slimecli/_recipes/swe_agent.yaml",
            "slimecli/swe/synth/probe.py"} <= names


def test_every_command_of_the_help_tree_has_an_invocation(tree: dict[tuple[str, ...], list[str]],
                                                          workspace: Workspace) -> None:
    commands = set(leaves(tree))
    assert len(commands) >= 25 and ("tasks", "env", "prune") in commands  # the whole tree was read
    missing = sorted(commands - set(invocations(workspace)))
    assert not missing, f"commands without an invocation in tests/helpers/plain_commands.py: {missing}"
    assert not set(invocations(workspace)) - commands  # and none that is gone


def test_every_command_works_and_none_prints_a_traceback(results: dict[tuple[str, ...], list[Result]]) -> None:
    failed = [shown(r) for rs in results.values() for r in rs
              if r.returncode not in (SERVER_EXITS if r.invocation.ready else (0,))
              or "Traceback (most recent call last)" in r.output or (r.invocation.ready and not r.ready)]
    assert not failed, "\n\n".join(failed)


def test_lora_training_shows_slimecli_lines_only_and_resumes_with_its_settings(
        results: dict[tuple[str, ...], list[Result]], workspace: Workspace) -> None:
    first, resumed, replayed = results[("train",)]
    lines = first.stdout.splitlines()
    assert not [line for line in lines if re.search(r"\w+Warning: ", line)], first.stdout  # in the run's logs
    assert "UserWarning" in (workspace.files["run"] / "logs" / "trainer.log").read_text()
    assert not [line for line in lines if re.fullmatch(r"\s*\w[\w-]* \|\s*", line)]  # no empty `trainer |` line
    assert f"merged model {workspace.files['run'] / 'final-merged'}" in first.stdout
    assert re.search(r"wall time +this command: [\dhms]+; the run: [\dhms]+", first.stdout)
    assert re.search(r"^resume: \S*slimecli train run\.dir=\S+$", first.stdout, re.M)  # runnable as printed
    assert "run complete: 2/2 steps done" in resumed.stdout and "config changed" not in resumed.stdout
    assert "rank: 8" in (workspace.files["run"] / "config.yaml").read_text()
    # its dumped samples trained on again with no engine, and scored again with another reward
    assert "replayed     the rollout dump" in replayed.stdout and "engine-0" not in replayed.stdout
    (reverified,) = results[("rollout", "reverify")]
    assert re.search(r"\d+ of \d+ samples changed reward over 2 dumped steps", reverified.stdout), reverified.output


def test_synthesised_tasks_are_checked_graded_and_counted(results: dict[tuple[str, ...], list[Result]],
                                                         workspace: Workspace) -> None:
    (synth,) = results[("tasks", "synth")]
    assert "1 valid tasks" in synth.output and "environment" in synth.output
    (check,) = results[("tasks", "check")]
    assert "1/1 tasks valid" in check.output
    (grade,) = results[("tasks", "grade")]
    assert json.loads(grade.stdout)["resolved"] == 1  # the gold patch resolves the task
    stats = results[("tasks", "stats")]
    assert "tinystats" in stats[1].output
    (listed,) = results[("tasks", "env", "list")]
    assert listed.stdout.startswith("runner-") and "pytest" in listed.stdout  # the tests ran in the task's env
    assert not list(workspace.files["envs"].glob("runner-*"))  # pruned


@pytest.mark.parametrize("extra", sorted(name for name, packages in EXTRAS.items()
                                         if name != "dev" and any(not p.startswith("slimecli[") for p in packages)))
def test_an_extras_feature_without_it_names_the_extra(extra: str, slimecli: Path, workspace: Workspace) -> None:
    probes = extra_probes(workspace)
    assert extra in probes, f"no probe for the {extra} extra in tests/helpers/plain_commands.py"
    import os

    result = run_one(slimecli, probes[extra], workspace.root, {**os.environ, "COLUMNS": "200"})
    assert result.returncode == 2 and "Traceback" not in result.output, shown(result)
    naming = [line for line in result.output.splitlines() if f"slimecli[{extra}]" in line]
    assert len(naming) == 1, shown(result)
