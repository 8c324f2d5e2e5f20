"""The progress line's reward: the mean of the last steps (not of the whole run), named the same on a
terminal's bar and in plain lines."""

from __future__ import annotations

import io
import json

from rich.console import Console

from slimecli.observe.progress import RecentRewards, StepProgress, reward_text


def test_the_mean_covers_the_last_steps_only():
    recent = RecentRewards(window=3)
    assert recent.text() == "" and reward_text(None, recent) == ""
    for value in (0.0, 0.0, 0.0, 1.0, None, float("nan"), True, 1.0):  # steps without a number are not counted
        recent.add(value)
    assert recent.text() == "reward (last 3) 0.667"  # 0, 1, 1 -- a whole-run mean would say 0.4
    recent.add(1.0)
    assert reward_text(1.0, recent) == "step reward 1.000 | reward (last 3) 1.000"


def test_plain_lines_and_the_terminal_bar_say_the_same(tmp_path):
    from slimecli.observe.follow import MetricsFollower

    rewards = [0.0] * 10 + [1.0] * 10
    recent = RecentRewards()
    plain = io.StringIO()
    with StepProgress(total=20, file=plain) as bar:
        for step, value in enumerate(rewards, start=1):
            recent.add(value)
            bar.update(step, reward_text(value, recent))
    last_plain = plain.getvalue().splitlines()[-1]
    assert last_plain.endswith("step reward 1.000 | reward (last 10) 1.000")

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward/mean": v}) + "\n"
                                                    for i, v in enumerate(rewards, start=1)))
    out = io.StringIO()
    follower = MetricsFollower(Console(file=out, force_terminal=True, width=100), total=20,
                               run_dir=lambda: tmp_path, poll_s=3600).start()
    follower.stop()
    assert "step reward 1.000 | reward (last 10) 1.000" in out.getvalue()
    assert "running" not in out.getvalue() + plain.getvalue()


def test_a_resumed_run_carries_its_window_on(tmp_path):
    """The trainer's records of a run resumed at step 12 start from the last 10 steps it trained before."""
    from slimecli.train.records import StepRecords

    rewards = [0.0] * 2 + [1.0] * 10 + [0.0] * 3  # steps 13-15 were logged, not checkpointed: trained again
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward/mean": v}) + "\n"
                                                    for i, v in enumerate(rewards, start=1)))
    records = StepRecords(tmp_path, max_steps=20, step=12, reward_key=None, restored_row=None)
    try:
        assert records.recent.text() == "reward (last 10) 1.000"  # steps 3-12, not a window restarted empty
    finally:
        records.close()
    fresh = StepRecords(tmp_path / "new", max_steps=20, step=0, reward_key=None, restored_row=None)
    fresh.close()
    assert fresh.recent.text() == ""
