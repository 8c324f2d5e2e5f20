"""`slimecli train` with the algorithms chosen by config value, as real processes on 2 trainer ranks: PPO with a critic
(GAE), CISPO, DAPO's overlong shaping and Dr. GRPO's reduction in one short run, whose critic is checkpointed and
restored on a resume. Learning itself is measured by bench/bench_algorithms.py (the quickstart to >= 0.95)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.train_e2e import metrics, run_train

pytestmark = pytest.mark.slow

ALGORITHMS = ("trainer.advantage_estimator=gae", "trainer.policy_loss=cispo", "trainer.overlong_buffer=4",
              "trainer.loss_reduction=token_sum_norm", "trainer.scale_by_std=false", "trainer.nproc=2",
              "trainer.save_interval=1", "eval.at_start=false", "eval.at_end=false")


def test_critic_run_on_two_ranks_checkpoints_and_resumes_its_critic(tmp_path):
    run = tmp_path / "run"
    out = run_train(run, *ALGORITHMS, "trainer.max_steps=2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("critic/value_loss", "critic/values_mean", "critic/returns_mean", "critic/grad_norm",
                "reward/overlong_penalty_mean", "reward/overlong_frac", "train/pg_clipfrac"):
        assert key in rows[-1], key
    saved = torch.load(run / "checkpoints" / "step_2" / "critic.pt", weights_only=True)
    assert set(saved) == {"model", "optimizer"} and "value_head.weight" in saved["model"]
    assert saved["model"]["value_head.weight"].abs().sum() > 0  # trained: the head starts at zero
    out = run_train(run, *ALGORITHMS, "trainer.max_steps=3")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert "critic restored from" in out.stdout + out.stderr
    resumed = torch.load(run / "checkpoints" / "step_3" / "critic.pt", weights_only=True)
    assert resumed["optimizer"]["state"], "the restored critic's optimizer state went on"
