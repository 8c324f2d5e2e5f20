"""Evaluation end to end: a short quickstart run evaluates its held-out set at start and end, then
`slimecli eval` evaluates the run's final policy (and a checkpoint on other datasets) as real processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slimecli.observe.metrics import read_metrics
from tests.helpers import ROOT, free_port
from tests.helpers.train_e2e import QUICKSTART_STEPS, quickstart_run

pytestmark = pytest.mark.slow  # every test here starts real processes

STEPS = QUICKSTART_STEPS
HELDOUT = 16 * 4  # the quickstart's held-out prompts x n_samples_per_prompt


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_eval(*overrides: str):
    import subprocess

    return subprocess.run([sys.executable, "-m", "slimecli", "eval", f"rollout.port={free_port()}", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run, _ = quickstart_run(tmp_path_factory)
    return run


def test_training_evaluates_at_start_and_end(trained):
    rows = read_metrics(trained)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # the start's evaluation: a row of its own, step 0
    first, last = rows[0], rows[-1]
    assert first["eval/weight_version"] == 0 and last["eval/weight_version"] == STEPS
    assert not any(k.startswith(("reward/", "train/")) for k in first)  # no step trained yet
    assert not any(k.startswith("eval/") for r in rows[1:-1] for k in r)  # eval.interval=0: nothing in between
    for row in (first, last):
        for key in ("reward_mean", "pass@1", "pass@2", "pass@4", "response_len_mean", "invalid", "failed"):
            assert isinstance(row[f"eval/heldout/{key}"], float), key
        assert row["eval/heldout/samples"] == HELDOUT and row["eval/heldout/failed"] == 0.0
        assert "eval/heldout/pass@8" not in row
    assert last["time/eval_s"] > 0  # the last step waited for its evaluation
    for step in (0, STEPS):
        samples = lines(trained / "eval" / f"step_{step}" / "heldout.jsonl")
        assert len(samples) == HELDOUT
        assert {s["prompt_index"] for s in samples} == set(range(16))
        assert all(0.0 <= s["value"] <= 1.0 and s["response"] is not None for s in samples)
        mean = sum(s["value"] for s in samples) / len(samples)
        row = first if step == 0 else last
        assert mean == pytest.approx(row["eval/heldout/reward_mean"])
    assert not (trained / "eval" / "step_1").exists()  # eval.interval=0: nothing in between


def test_eval_of_the_runs_final_policy(trained):
    out = run_eval(f"run.dir={trained}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for text in ("heldout", "reward_mean", "pass@4", "response_len_mean", "invalid", "ok"):
        assert text in out.stdout, out.stdout
    (eval_dir,) = (trained / "evals").iterdir()
    samples = lines(eval_dir / "eval" / f"step_{STEPS}" / "heldout.jsonl")
    assert len(samples) == HELDOUT
    (row,) = read_metrics(eval_dir)
    assert row["step"] == STEPS and row["eval/heldout/samples"] == HELDOUT
    summary = json.loads((eval_dir / "eval" / f"step_{STEPS}" / "summary.json").read_text())
    assert summary["datasets"][0]["metrics"]["reward_mean"] == pytest.approx(row["eval/heldout/reward_mean"])
    assert (eval_dir / "config.yaml").is_file() and (eval_dir / "logs" / "evaluator.log").is_file()


def test_eval_of_a_checkpoint_fails_when_a_dataset_does(trained, tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text('{"prompt": "say hi", "label": "HI"}\n{"prompt": "say yo", "label": "YO"}\n')
    bad.write_text('{"question": "no prompt key"}\n')
    datasets = (f"eval.datasets=[{{name:good,path:'{good}',n_samples_per_prompt:2,reward:{{name:exact_match}}}},"
                f"{{name:bad,path:'{bad}'}}]")
    out = run_eval(f"model.path={trained / 'final'}", f"run.root={tmp_path / 'runs'}", datasets)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "good" in out.stdout and "failed" in out.stdout and "no 'prompt' field" in out.stdout
    (eval_dir,) = (tmp_path / "runs").iterdir()
    assert eval_dir.name.startswith("eval-")
    assert len(lines(eval_dir / "eval" / "step_0" / "good.jsonl")) == 4
    (row,) = read_metrics(eval_dir)
    assert row["eval/good/failed"] == 0.0 and row["eval/bad/failed"] == 1.0 and "eval/bad/reward_mean" not in row
    assert row["eval/good/pass@2"] is not None


def test_a_resume_evaluates_the_step_whose_row_waited_for_its_evaluation(tmp_path):
    """Checkpoint step_2 keeps its row while the evaluation of step 2 runs; the trainer then blocks at step 3 (a
    test hook) and is killed, so that row never reached metrics.jsonl. The same command resumes from step_2,
    evaluates step 2 again, writes its row with that evaluation, and trains on."""
    import os
    import subprocess

    from slimecli.checkpoint.layout import checkpoints_dir, is_complete
    from tests.helpers import wait_until
    from tests.helpers.train_e2e import kill_tree, run_train, train_argv

    run = tmp_path / "run"
    args = ("trainer.max_steps=4", "trainer.save_interval=2", "eval.interval=2", "trainer.nproc=1")
    proc = subprocess.Popen(train_argv(run, *args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "SLIMECLI_TEST_HANG_AT_STEP": "3"})
    try:
        wait_until(lambda: is_complete(checkpoints_dir(run) / "step_2"), 300, "checkpoint step_2", proc=proc)
    finally:
        kill_tree(proc)
    assert [r["step"] for r in read_metrics(run)] == [0, 1]  # step 2's row waited for its evaluation

    out = run_train(run, *args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r.get("eval/weight_version") for r in rows] == [0, None, 2, None, 4]
    assert rows[2]["reward/mean"] is not None and rows[2]["eval/heldout/samples"] == HELDOUT
    assert (run / "eval" / "step_2" / "heldout.jsonl").is_file()
