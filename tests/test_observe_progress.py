"""Progress bar: plain lines off a TTY, a rich bar on one."""

from __future__ import annotations

import io

from rich.console import Console

from slimecli.observe.progress import StepProgress


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


def test_notes_within_a_step_are_rate_limited_off_a_tty(monkeypatch):
    import slimecli.observe.progress as progress_mod

    now = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    bar = StepProgress(total=2, file=out)
    bar.note("agent runs: 1 done, 3 running, resolved 1.00")
    now[0] += 5
    bar.note("agent runs: 2 done, 2 running, resolved 0.50")  # within note_interval_s: not printed
    now[0] += bar.note_interval_s
    bar.note("agent runs: 4 done, 0 running, resolved 0.25")
    lines = out.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["agent runs: 1 done, 3 running, resolved 1.00",
                                                          "agent runs: 4 done, 0 running, resolved 0.25"]


def test_plain_lines_carry_an_eta_and_the_last_eval():
    from slimecli.observe.progress import eta_text

    assert eta_text(10.0, 2, 4) == "ETA 20s" and eta_text(30.0, 1, 3) == "ETA 1m30s" and eta_text(5.0, 0, 4) == ""
    out = io.StringIO()
    with StepProgress(total=4, start=1, file=out) as bar:
        bar.update(2, "step reward 0.500", metrics={"eval/heldout/reward_mean": 0.625, "eval/heldout/pass@1": 0.5})
        bar.update(3, "step reward 0.700", metrics={"reward/mean": 0.7})  # no eval this step: the last one stays
    lines = out.getvalue().splitlines()
    assert "ETA" in lines[0] and lines[0].endswith("step reward 0.500 | eval heldout 0.625")
    assert lines[1].endswith("step reward 0.700 | eval heldout 0.625")


def test_step_lines_are_left_to_the_controller(monkeypatch):
    from slimecli.observe.progress import PROGRESS_ENV

    monkeypatch.setenv(PROGRESS_ENV, "controller")
    out = io.StringIO()
    with StepProgress(total=2, file=out) as bar:
        bar.update(1, "reward 0.5")
        bar.note("agent runs: 1 done")  # within a step: only the trainer knows, so it still says it
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]] and "agent runs" in out.getvalue()


def test_the_controller_bar_follows_metrics_jsonl(tmp_path):
    import json

    from slimecli.observe.follow import MetricsFollower

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    found: list = [None]
    follower = MetricsFollower(console, total=10, run_dir=lambda: found[0], poll_s=3600).start()  # polled by hand
    follower.poll()  # no run directory yet: nothing to show
    found[0] = tmp_path
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 4, "reward/mean": 0.5}) + "\n" + '{"step": 5, "rew')  # a resume; a cut line
    follower.poll()
    assert follower.rows == 1
    with open(path, "a") as f:
        f.write('ard/mean": 0.75, "eval/heldout/reward_mean": 0.9}\n')
    follower.poll()
    assert follower.rows == 2 and follower.last_eval == "eval heldout 0.900"
    follower.stop()
    text = out.getvalue()
    assert "5/10" in text and "step reward 0.750 | reward (last 10) 0.625 | eval heldout 0.900" in text


def test_own_run_dir_is_the_one_this_process_locked(tmp_path):
    import json
    import os
    import socket

    from slimecli.cli.train import own_run_dir
    from slimecli.config.compose import load

    cfg = load([f"run.root={tmp_path}"])
    assert own_run_dir(cfg) is None
    for name, pid in (("quickstart-20260101-000000", 1), ("quickstart-20260101-000001", os.getpid())):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    assert own_run_dir(cfg) == (tmp_path / "quickstart-20260101-000001").resolve()
    assert own_run_dir(load([f"run.dir={tmp_path / 'x'}"])) is None  # not created (the run never started)
