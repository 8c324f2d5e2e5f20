"""builtin:swe_tiny_smoke: each task lists 3 shell edits; run as the CLI would run them, only the listed gold
edit resolves, the others apply and leave the bug (so a constrained smoke run's rewards vary in a group)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from slimecli.swe.builtin import task_file
from slimecli.swe.grade import capture_diff, grade, local_sandbox
from slimecli.swe.task import load
from slimecli.swe.workspace import prepare
from tests.helpers import ROOT
from tools.smoke_build import LABELS

FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
TASKS = load(str(task_file("swe_tiny_smoke"))).tasks


def test_the_smoke_file_is_what_swe_tiny_gives():
    out = subprocess.run([sys.executable, "-m", "tools.smoke_build", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(TASKS) == 20 and {len(t.extra["choices"]) for t in TASKS} == {3}
    assert len({t.extra["gold_choice"] for t in TASKS}) == 3  # the gold edit is not always in one place


async def _outcome(task, choice: dict, tmp: Path) -> dict:
    ws = tmp / "ws"
    ws.mkdir(parents=True)
    prepare(task, ws)
    sandbox = local_sandbox(ws)
    try:
        result = await sandbox.exec(["bash", "-c", choice["shell"]], timeout_s=30)
        assert result.returncode == 0, result.stderr
        diff = await capture_diff(sandbox)
    finally:
        sandbox.close()
    report = await grade(task, diff, sandbox_factory=local_sandbox, budget_s=120, test_env=FAST)
    return report.as_dict()


@pytest.mark.parametrize("task", TASKS, ids=[t.instance_id for t in TASKS])
def test_only_the_gold_choice_resolves(task, tmp_path):
    outcomes = [asyncio.run(_outcome(task, c, tmp_path / str(i))) for i, c in enumerate(task.extra["choices"])]
    assert [o["resolved"] for o in outcomes] == [int(i == task.extra["gold_choice"]) for i in range(3)], outcomes
    assert all(o["applied"] for o in outcomes)
    assert not any("\nindex " in c["shell"] for c in task.extra["choices"])
    labels = [c["shell"].split("\n", 1)[0] for c in task.extra["choices"]]
    assert labels[task.extra["gold_choice"]] == LABELS[0] and sorted(labels) == sorted(LABELS)  # chosen by their code, not by blob hashes
