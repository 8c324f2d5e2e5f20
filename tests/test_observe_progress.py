"""Progress bar: plain lines off a TTY, a rich bar on one; the running mean never fails on odd rewards."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from slimecli.observe.progress import RunningMean, StepProgress


def test_plain_lines_when_not_a_tty():
    out = io.StringIO()
    with StepProgress(total=4, file=out) as bar:
        assert bar.plain
        bar.update(1, "reward 0.250")
        bar.update(2)
    got = out.getvalue().splitlines()
    assert len(got) == 2
    assert got[0].startswith("train step 1/4 [") and got[0].endswith("reward 0.250")
    assert got[1].startswith("train step 2/4 [")


def test_rich_bar_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with StepProgress(total=10, start=3, console=console) as bar:
        assert not bar.plain
        bar.update(5, "reward 0.900")
    text = out.getvalue()
    assert "5/10" in text and "reward 0.900" in text


def test_running_mean_skips_non_numeric_rewards():
    rm = RunningMean(key="score", window=2)
    assert rm.text() == "reward n/a"
    # dict rewards read through the key; a teacher's JSON without it, strings and NaN are skipped
    assert rm.update([1.0, {"score": 0.0, "acc": 1}, {"teacher": {"logp": [1, 2]}}, "oops", float("nan")]) == 0.5
    assert rm.skipped == 3
    assert rm.update([None, {"nope": 1}]) is None
    assert rm.update([True, 0]) == 0.5
    assert rm.update([1.0]) == 1.0
    assert rm.mean == pytest.approx(3 / 5)  # 1, 0, 1, 0, 1
    assert rm.recent == pytest.approx(0.75)  # last 2 step means: 0.5, 1.0
    assert rm.text() == "reward 0.750 (last 2) mean 0.600"
