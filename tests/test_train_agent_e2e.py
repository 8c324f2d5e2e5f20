"""`slimecli train +recipe=swe_agent` end to end: the real Claude Code CLI works builtin SWE tasks against the
tiny random model through two managed engines, every run is graded, and two training steps complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slimecli.agent.harness.install import locate
from tests.helpers.train_e2e import metrics, run_train

pytestmark = [pytest.mark.slow, pytest.mark.agent_cli,
              pytest.mark.skipif(locate("claude_code") is None, reason="the claude_code CLI is not installed: run "
                                 "`slimecli agent install claude_code` (CI does)")]


def two_small_steps(run: Path, *overrides: str) -> list[dict]:
    """+recipe=swe_agent for 2 steps of 2 tasks x 2 runs on one trainer rank; the metrics rows. The CLI offers
    Bash alone (agent.tools): its other tools' schemas would make every sample 4x longer to prefill and train on."""
    out = run_train(run, "+recipe=swe_agent", "agent.tools=[Bash]", "trainer.max_steps=2", "rollout.batch_size=2",
                    "rollout.n_samples_per_prompt=2", "trainer.global_batch_size=4", "trainer.nproc=1",
                    "agent.time_budget_s=60", "agent.max_new_tokens=16", *overrides, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    return rows


def test_swe_agent_recipe_trains_two_steps_over_two_engines_with_async_rollout(tmp_path):
    """Two engines and trainer.async_rollout in one run: sessions spread over both engines, step 2's runs happen
    while step 1 trains (one version behind), and both engines get the new weights after each step."""
    run = tmp_path / "swe"
    rows = two_small_steps(run, "rollout.num_engines=2", "trainer.async_rollout=true")
    for row in rows:
        assert row["agent/runs"] >= 4 and row["rollout/samples"] >= 4
        for key in ("swe/resolved_rate", "swe/empty_patch_rate", "agent/retries", "agent/run_s_p95", "reward/mean",
                    "agent/branches_mean", "agent/time/engine_s", "agent/time/grade_s"):
            assert key in row, key
        assert 0.0 <= row["reward/mean"] <= 1.0  # a random model resolves next to nothing
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0]  # async: step 2's runs were made ahead
    # what the run kept: a row per task and step (the runs made ahead are filed under the step they train), and
    # each run's transcript, diff and outcome
    tasks = [json.loads(line) for line in (run / "agent" / "tasks.jsonl").read_text().splitlines()]
    assert {t["step"] for t in tasks} == {1, 2} and all(t["runs"] == 2 for t in tasks)
    kept = list((run / "agent" / "runs").glob("step_*/*/run.json"))
    assert len(kept) >= 8
    infos = [json.loads(p.read_text()) for p in kept]
    from slimecli.config.groups.sandbox import SandboxConfig
    from slimecli.sandbox.auto import choose

    expected = choose(SandboxConfig()).kind  # sandbox=auto: bwrap where it starts (never local)
    assert {i["agent"] for i in infos} == {"claude_code"} and {i["sandbox"] for i in infos} == {expected}
    assert {i["engine"] for i in infos} == {0, 1}  # sessions spread over both engines
    transcript = kept[0].parent.joinpath("transcript.txt").read_text()
    assert "PROBLEM_STATEMENT.md" in transcript  # the CLI's own prompt, decoded
    for i in (0, 1):  # both engines got the new weights after each step
        assert (run / "logs" / f"engine-{i}.log").read_text().count("weights updated") == 2
