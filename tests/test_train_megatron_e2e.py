"""`slimecli train trainer=megatron` end to end on CPU (2 gloo ranks, TP=2): learning, stateless Adam, resume."""

from __future__ import annotations

import os
import re
import signal

import pytest

from slimecli.checkpoint import store as checkpoint
from tests.helpers import wait_until
from tests.helpers.train_e2e import descendants, kill_tree, metrics, rank_pids, run_train, start_train

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow

TP2 = ("trainer=megatron", "trainer.tensor_parallel_size=2", "trainer.nproc=2")


def sharded_keys(directory) -> list[str]:
    """The tensors a megatron-core distributed checkpoint holds (from its PyTorch DCP metadata)."""
    from torch.distributed.checkpoint import FileSystemReader

    return list(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


def adam_step(directory) -> int:
    """Adam's step count in a megatron-core distributed checkpoint: the step every parameter shares, kept in
    common.pt with what is not sharded. A resume that restored the optimizer counts on from it."""
    import torch

    def find(obj):
        if isinstance(obj, dict):
            if "common_step" in obj:
                return obj["common_step"]
            return next((found for v in obj.values() if (found := find(v)) is not None), None)
        return None

    step = find(torch.load(directory / "common.pt", map_location="cpu", weights_only=False))
    assert step is not None, "no common_step in common.pt"
    return int(step)


def late_reward(run) -> float:
    rewards = [r["reward/mean"] for r in metrics(run)]
    return sum(rewards[-4:]) / 4


def test_tp2_learns_the_quickstart_with_stateless_adam_and_keeps_no_moments(tmp_path):
    """The whole quickstart (60 steps) at TP=2 with optimizer=stateless_adam: the reward ends at 0.8 or more, like
    trainer=torch, and the checkpoint holds no Adam moments. (Adam with moments, saved and restored, is the
    kill-and-resume run's; megatron's Adam update equals trainer=torch's in tests/test_train_megatron.py.)"""
    run = tmp_path / "tp2"
    out = run_train(run, *TP2, "optimizer=stateless_adam", "trainer.save_interval=0", timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert rows[0]["reward/mean"] < 0.2 and late_reward(run) >= 0.8, [r["reward/mean"] for r in rows]
    assert "megatron-core policy: TP=2 PP=1 DP=1" in out.stdout
    assert "megatron-core runs on the CPU" in out.stdout  # the shim says so
    ckpt = checkpoint.load(run)
    assert ckpt.optimizer_state is None and ckpt.metadata["optimizer"] == "stateless_adam"
    assert ckpt.sharded is not None and not [k for k in sharded_keys(ckpt.sharded) if "optimizer" in k]

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "final")  # gathered from both TP ranks, HF names
    assert final.config.architectures == ["Qwen3ForCausalLM"]


def test_resume_after_kill_of_a_trainer_rank_with_weights_sent_by_broadcast(tmp_path):
    """kill -9 one TP rank mid-run: the run stops; the same command resumes at the next step with both ranks'
    Adam state, and metrics.jsonl has every step exactly once.

    trainer.weight_sync=nccl (gloo on CPU): the TP shards gathered on rank 0 go to the engine over a process
    group instead of a directory, through the same weight-sync interface as trainer=torch, in the first run and
    again after the resume (a new group with the new engine)."""
    run = tmp_path / "r"
    args = (*TP2, "trainer.max_steps=6", "trainer.save_interval=1", "trainer.weight_sync=nccl")
    proc = start_train(run, *args)
    try:
        wait_until(lambda: (found := checkpoint.latest_complete(run)) is not None and found.name == "step_3", 300,
                   "checkpoint step_3", proc=proc)
        ranks = rank_pids(descendants(proc.pid))
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        code = proc.wait(timeout=60)
        output = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert code != 0, output[-3000:]
    done_before = checkpoint.load(run).step
    assert 3 <= done_before < 6
    ckpt = checkpoint.load(run)
    assert ckpt.optimizer_state is None and ckpt.sharded is not None  # megatron-core's format, each rank its part
    assert [k for k in sharded_keys(ckpt.sharded) if "exp_avg_sq" in k]  # Adam moments
    assert adam_step(ckpt.sharded) == done_before
    out = run_train(run, *args, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"at step {done_before}" in out.stdout
    assert [r["step"] for r in metrics(run)] == list(range(1, 7))
    assert [r["weight_version"] for r in metrics(run)] == list(range(1, 7))
    assert adam_step(checkpoint.load(run).sharded) == 6  # counted on from the checkpoint's: the state was restored
    # the resumed run's engine (its part of the log: after its own start line) took its weights from the group:
    # the checkpoint's first, then one update per step it ran
    resumed = (run / "logs" / "engine-0.log").read_text().rsplit("slimecli engine ready", 1)[1]
    versions = re.findall(r"weights updated from group \(\d+ tensors, weight_version=(\d+)\)", resumed)
    assert versions == [str(v) for v in range(done_before, 7)], resumed
