"""End to end: `slimecli train reward=python` with a reward that returns dicts, strings and raises.

Checks what only a real run shows: exit 0, invalid rewards counted by reason in metrics.jsonl,
the failing function's traceback once in the run log, and the invalid count on the progress bar.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers.train_e2e import metrics, run_train

REWARD = textwrap.dedent('''
    def score(sample):
        kind = sample.index % 4
        if kind == 0:
            return {"score": 1.0, "acc": True, "pred": sample.response[:5]}
        if kind == 1:
            return "not a number"
        if kind == 2:
            raise ValueError("this reward function fails on purpose")
        return {"acc": False}  # no reward.key in it
''')


@pytest.mark.slow
def test_train_with_a_python_reward_returning_junk(tmp_path):
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    run_dir = tmp_path / "run"
    out = run_train(run_dir, "reward=python", f"reward.path={reward}:score", "reward.key=score",
                    "trainer.max_steps=2", "trainer.save_interval=0", "trainer.nproc=1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        quarter = row["reward/count"] / 4
        reasons = {k: v for k, v in row.items() if k.startswith("reward/invalid/")}
        assert row["reward/invalid/string"] == quarter and row["reward/invalid/reward_error"] == quarter
        assert len(reasons) == 3 and sum(reasons.values()) == 3 * quarter, reasons  # and the dict without score
        assert row["reward/invalid"] == 3 * quarter and row["reward/valid"] == quarter
        assert row["reward/mean"] == 1.0 and row["reward/key/score/mean"] == 1.0  # the valid ones only
        assert "reward/key/acc/mean" in row and "reward/key/pred/mean" not in row  # per-key means of dict rewards
    log = (run_dir / "logs" / "trainer.log").read_text(errors="replace")
    assert log.count("ValueError: this reward function fails on purpose") == 1  # the traceback, once
    assert log.count("samples have no reward (metadata.reward_error): ValueError") >= 2  # a summary per scoring
    assert f"({int(rows[-1]['reward/invalid'] * 2)} invalid rewards so far)" in out.stdout  # the progress line
