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
