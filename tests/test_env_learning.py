"""The built-in tool environment learns, end to end: `slimecli train +recipe=env_lookup` shortened to 30 steps (the
whole curve, from under 0.2 to 0.9 and more, is bench/bench_env_learning.py). The policy must learn to call
`lookup` first and then repeat what it said in `answer`; a policy that guesses earns nothing. Measured over runs of
30 steps, one step ahead as the recipe runs: the first 5 steps' mean reward 0.10-0.13, the last 5 steps' 0.77-0.91
in four runs (synchronous, 0.47-0.90)."""

from __future__ import annotations

import pytest

from tests.helpers.train_e2e import metrics, run_train

pytestmark = pytest.mark.slow


def test_the_tool_environment_reward_rises(tmp_path):
    run = tmp_path / "run"
    proc = run_train(run, "+recipe=env_lookup", "trainer.max_steps=30", "trainer.save_interval=0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = metrics(run)
    rewards = [row["env/lookup/reward"] for row in rows if "env/lookup/reward" in row]
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.25 and last >= first + 0.3, (first, last, rewards)
    looks = [row["env/lookup/tool_calls/lookup"] for row in rows[-5:]]  # a step's share moves by a few episodes
    assert sum(looks) / 5 >= 0.9, looks  # it looks before it answers
    assert rows[-1]["env/lookup/dropped"] == 0
