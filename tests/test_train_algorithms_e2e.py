"""`slimecli train` with the algorithms chosen by config value, as real processes: PPO with a critic (GAE), CISPO,
DAPO's overlong shaping and Dr. GRPO's reduction in one short run, whose critic is checkpointed and restored exactly
on a resume. Two ranks: the critic's update against one process in test_train_algorithms.py, and the quickstart's
own 2 ranks in bench/bench_algorithms.py, which measures the learning (to >= 0.95)."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.helpers.train_e2e import metrics, run_train

pytestmark = pytest.mark.slow

ARGS = ("trainer.advantage_estimator=gae", "trainer.policy_loss=cispo", "trainer.overlong_buffer=4",
        "trainer.loss_reduction=token_sum_norm", "trainer.scale_by_std=false", "trainer.nproc=1",
        "rollout.batch_size=2", "trainer.global_batch_size=16", "trainer.micro_batch_size=16",
        "trainer.save_interval=1", "trainer.max_steps=2", "eval.at_start=false", "eval.at_end=false")


def test_critic_run_checkpoints_and_resumes_its_critic_exactly(tmp_path):
    """Two steps, and a copy of the run as it stood after step 1 resumed by the same command: the same step-2
    critic metrics (a critic started afresh would give others: its head starts at zero)."""
    whole, run = tmp_path / "whole", tmp_path / "run"
    out = run_train(whole, *ARGS)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(whole)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("critic/value_loss", "critic/values_mean", "critic/returns_mean", "critic/grad_norm",
                "critic/vf_clipfrac", "reward/overlong_penalty_mean", "reward/overlong_frac", "train/pg_clipfrac"):
        assert key in rows[-1], key
    saved = torch.load(whole / "checkpoints" / "step_1" / "critic.pt", weights_only=True)
    assert set(saved) == {"model", "optimizer"} and saved["optimizer"]["state"]
    assert saved["model"]["value_head.weight"].abs().sum() > 0  # trained: the head starts at zero

    shutil.copytree(whole, run, ignore=shutil.ignore_patterns(".lock", "logs", "step_2", "v2", "final*"))
    out = run_train(run, *ARGS)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"critic restored from {run / 'checkpoints' / 'step_1'}" in (run / "logs" / "trainer.log").read_text()
    resumed, straight = metrics(run)[-1], rows[-1]
    assert resumed["step"] == 2 and resumed["reward/mean"] == straight["reward/mean"]  # the same draws
    for key in ("critic/values_mean", "critic/value_loss", "critic/returns_mean"):
        assert resumed[key] == pytest.approx(straight[key], rel=1e-3, abs=1e-6), key
