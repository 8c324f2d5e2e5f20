"""`slimecli train +recipe=swe_agent` end to end: the real Claude Code CLI works builtin SWE tasks against the
tiny random model through the managed engine, every run is graded, and two training steps complete."""

from __future__ import annotations

import pytest

from slimecli.agent.install import locate
from tests.e2e import metrics, run_train

pytestmark = [pytest.mark.slow, pytest.mark.agent_cli]


@pytest.mark.skipif(locate("claude_code") is None,
                    reason="the claude_code CLI is not installed: run `slimecli agent install claude_code` (CI does)")
def test_swe_agent_recipe_trains_two_steps(tmp_path):
    run = tmp_path / "swe"
    out = run_train(run, "+recipe=swe_agent", "trainer.max_steps=2", "rollout.batch_size=2",
                    "rollout.n_samples_per_prompt=2", "trainer.global_batch_size=4", "trainer.nproc=1",
                    "agent.time_budget_s=60", "agent.max_new_tokens=16", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["agent/runs"] >= 4 and row["rollout/samples"] >= 4
        for key in ("swe/resolved_rate", "swe/empty_patch_rate", "agent/retries", "agent/run_s_p95", "reward/mean"):
            assert key in row, key
        assert 0.0 <= row["reward/mean"] <= 1.0  # a random model resolves next to nothing
