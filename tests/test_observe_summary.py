"""The end-of-run summary, read from a fabricated run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slimecli.observe.summary import render, summarize


def fabricate(run: Path, rewards: list[float], *, max_steps: int, evals: dict[int, float] | None = None,
              final: bool = True) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(f"trainer:\n  max_steps: {max_steps}\n")
    rows = []
    for i, reward in enumerate(rewards, start=1):
        rows.append({"step": i, "time": 1000.0 + 10 * i, "reward/mean": reward, "time/step_s": 10.0,
                     "time/train_s": 2.0, "time/rollout_s": 7.5, "time/update_s": 2.0, "time/save_s": 0.5,
                     "time/eval_s": 0.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "rew')
    for step, value in (evals or {}).items():
        out = run / "eval" / f"step_{step}"
        out.mkdir(parents=True)
        datasets = [{"name": "heldout", "metrics": {"reward_mean": value}, "error": None},
                    {"name": "broken", "metrics": {}, "error": "FileNotFoundError: x"}]
        (out / "summary.json").write_text(json.dumps({"step": step, "datasets": datasets}))
    (run / "checkpoints" / f"step_{len(rewards)}").mkdir(parents=True)
    if final:
        (run / "final").mkdir()
        (run / "report").mkdir()
        (run / "report" / "report.html").write_text("<html></html>")
    return run


def test_a_finished_run_reports_reward_eval_time_and_where_its_results_are(tmp_path):
    run = fabricate(tmp_path / "run", [0.25, 1.0, 0.5, 0.75], max_steps=4, evals={0: 0.4, 2: 0.5, 4: 0.625})
    summary = summarize(run)
    assert summary.steps == 4 and summary.finished
    assert (summary.final_reward, summary.best_reward, summary.best_step) == (0.75, 1.0, 2)
    [change] = summary.evals  # the failed dataset has no reward to compare
    assert (change.name, change.before, change.before_step, change.after, change.after_step) == \
        ("heldout", 0.4, 0, 0.625, 4)
    assert summary.wall_s == pytest.approx(40.0)  # first step's start (1010 - 10) to the last row (1040)
    assert summary.stage_share == pytest.approx({"rollout": 0.75, "update": 0.2, "save": 0.05})
    assert list(summary.stage_share) == ["rollout", "update", "save"]  # largest first; the totals are no stage
    text = "\n".join(render(summary))
    assert "final 0.750, best 1.000 (step 2)" in text
    assert "heldout 0.400 -> 0.625 (step 0 -> 4)" in text and "broken" not in text
    assert "40s (rollout 75%, update 20%, save 5%)" in text
    assert f"final model  {run.resolve() / 'final'}" in text
    assert f"report       {run.resolve() / 'report' / 'report.html'}" in text
    assert text.splitlines()[-1].split(None, 1) == ["continue",
                                                   f"slimecli train trainer.max_steps=8 run.dir={run.resolve()}"]
    assert render(summary, "slimecli train +recipe=x run.dir=D")[-1] == "  continue     slimecli train +recipe=x run.dir=D"


def test_a_stopped_run_names_its_checkpoint_and_the_resume_command(tmp_path):
    run = fabricate(tmp_path / "run", [0.5, 0.5], max_steps=10, final=False)
    summary = summarize(run, command_s=125.0, command_start=500.0)  # this command logged every row (after 500)
    assert not summary.finished and summary.best_step == 1  # a tie: the first step that reached it
    lines = render(summary)
    assert lines[0] == "run summary (2 steps of 10)"
    assert any(line.startswith("  wall time    this command: 2m05s; the run: 2m05s") for line in lines)
    assert f"  checkpoint   {run.resolve() / 'checkpoints' / 'step_2'}" in lines
    assert not any("final model" in line or "report" in line or "eval" in line for line in lines)
    assert lines[-1] == f"  resume       slimecli train run.dir={run.resolve()}"


def test_a_run_without_metrics_still_says_how_to_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("trainer:\n  max_steps: 3\n")
    lines = render(summarize(run))
    assert "  reward       none logged" in lines and lines[-1].startswith("  resume       slimecli train run.dir=")


def test_train_prints_the_summary_with_the_run_s_own_resume_command(tmp_path):
    import io

    from rich.console import Console

    from slimecli.cli.train import _summary
    from slimecli.config.compose import load

    run = fabricate(tmp_path / "run", [0.5, 1.0], max_steps=4, final=False)
    out = io.StringIO()
    _summary(load([f"run.dir={run}"]), Console(file=out, width=300), 12.0, 1015.0, ["optimizer.lr=1e-6"])
    lines = out.getvalue().splitlines()
    assert lines[0] == "run summary (2 steps of 4)"
    # step 1 (1000-1010) was an earlier command's; this command: 12 s
    assert "  wall time    this command: 12s; the run: 22s (rollout 75%, update 20%, save 5%)" in lines
    assert lines[-1] == f"  resume       slimecli train run.dir={run.resolve()}"  # the run keeps its own settings


def test_a_resumed_run_counts_every_commands_steps_but_not_the_gap_between_them(tmp_path):
    """120 steps of 120 after `continue`: the run's wall time is not the continuation's own clock."""
    run = fabricate(tmp_path / "run", [0.5] * 4, max_steps=4)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()[:4]]
    for row in rows[2:]:
        row["time"] += 3600.0  # resumed an hour later
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert summarize(run).wall_s == pytest.approx(40.0)  # four 10 s steps; the hour between is no part of it
    resumed = summarize(run, command_s=30.0, command_start=1020.0 + 1800.0)  # this command logged steps 3 and 4
    assert (resumed.command_s, resumed.wall_s) == (30.0, pytest.approx(50.0))  # steps 1-2 (20 s) + this command
    assert "  wall time    this command: 30s; the run: 50s (rollout 75%, update 20%, save 5%)" in render(resumed)


def test_a_lora_run_names_its_adapter_and_its_merged_model(tmp_path):
    run = fabricate(tmp_path / "run", [0.5, 1.0], max_steps=2)
    (run / "final-merged").mkdir()
    lines = render(summarize(run))
    assert f"  final model  {run.resolve() / 'final'} (the LoRA adapter)" in lines
    assert f"  merged model {run.resolve() / 'final-merged'}" in lines
    assert not any("merged" in line for line in render(summarize(fabricate(tmp_path / "full", [1.0], max_steps=1))))


@pytest.mark.parametrize(("config", "said"), [
    ("sandbox:\n  name: local\ntask:\n  name: swe\nagent:\n  name: claude_code\n", True),
    ("sandbox:\n  name: local\nagent:\n  name: none\neval:\n  datasets:\n  - {name: swe, task: swe}\n", True),
    ("sandbox:\n  name: local\nagent:\n  name: none\ntask:\n  name: quickstart\n", False),  # no agent code ran
    ("sandbox:\n  name: bwrap\nagent:\n  name: codex\n", False),
])
def test_a_run_whose_agent_ran_unisolated_says_so(tmp_path, config, said):
    run = fabricate(tmp_path / "run", [0.5], max_steps=1)
    (run / "config.yaml").write_text("trainer:\n  max_steps: 1\n" + config)
    lines = render(summarize(run))
    flagged = [line for line in lines if line.startswith("  sandbox      local, not isolated: ")]
    assert len(flagged) == int(said), lines
    if said:
        assert "reach every loopback port" in flagged[0]
