"""`slimecli train` end to end on CPU: learning, checkpoints, resume after kill -9, engine death."""

from __future__ import annotations

import os
import re
import signal

import pytest

from slimecli.checkpoint import store as checkpoint
from tests.helpers import wait_dead, wait_until
from tests.helpers.train_e2e import (
    QUICKSTART_STEPS,
    cmdline,
    descendants,
    kill_tree,
    metrics,
    quickstart_run,
    run_train,
    start_train,
)

pytestmark = pytest.mark.slow


def test_quickstart_reward_rises(tmp_path_factory):
    """A shortened quickstart (2 trainer ranks, 1 engine): the reward must clearly go up."""
    run, stdout = quickstart_run(tmp_path_factory)
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, QUICKSTART_STEPS + 1))
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > 3 * first and last > 0.5, rewards
    assert all(r["weight_version"] == r["step"] for r in rows)
    for key in ("train/entropy", "train/grad_norm", "train/lr", "train/pg_clipfrac", "train/ppo_kl",
                "rollout/response_len_mean", "time/step_s", "perf/tokens_per_s", "reward/std"):
        assert key in rows[-1], key
    assert checkpoint.latest_complete(run).name == f"step_{QUICKSTART_STEPS}"
    assert (run / "tensorboard").is_dir() and (run / "logs" / "engine-0.log").is_file()
    assert f"train step {QUICKSTART_STEPS}/{QUICKSTART_STEPS}" in stdout


def test_resume_after_controller_kill(tmp_path):
    """kill -9 the controller mid-run; the same command resumes: no finished step lost or repeated."""
    run = tmp_path / "r"
    args = ("trainer.max_steps=8", "trainer.save_interval=1", "trainer.nproc=1")  # one rank: ranks are not tested
    proc = start_train(run, *args)
    try:
        wait_until(lambda: checkpoint.latest_complete(run) is not None and
                   checkpoint.latest_complete(run).name == "step_3", 300, "checkpoint step_3", proc=proc)
        children = descendants(proc.pid)
        proc.kill()  # SIGKILL: the children must notice and go on their own
        proc.wait()
        assert wait_dead(children, timeout=15) == [], "children outlived the killed controller"
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    done_before = checkpoint.load(run).step
    out = run_train(run, *args)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "resuming" in out.stdout
    steps = [r["step"] for r in metrics(run)]
    assert steps == list(range(1, 9)), steps
    assert re.search(rf"train step {done_before + 1}/8", out.stdout)  # continued, not restarted
    assert f"train step {done_before}/8" not in out.stdout.replace(f"step {done_before}/8 [", "")


def test_engine_kill_stops_the_run_then_the_same_command_finishes(tmp_path):
    run = tmp_path / "k"
    args = ("trainer.max_steps=12", "trainer.save_interval=1", "trainer.nproc=1")
    proc = start_train(run, *args)
    try:
        wait_until(lambda: len(metrics(run)) >= 2, 300, "two steps", proc=proc)
        children = descendants(proc.pid)
        (engine_pid,) = [p for p in children if b"slimecli.engine" in cmdline(p)]
        os.kill(engine_pid, signal.SIGKILL)
        code = proc.wait(timeout=30)  # the supervisor notices the death itself: no request has to time out
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert code != 0, code
    assert "engine-0 was killed by SIGKILL" in output
    assert wait_dead(children, timeout=10) == []
    out = run_train(run, *args, timeout=900)  # the same command: resumes and finishes
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resuming" in out.stdout
    assert [r["step"] for r in metrics(run)] == list(range(1, 13))


def test_stateless_adam_checkpoint_has_no_moments(tmp_path):
    run = tmp_path / "s"
    out = run_train(run, "optimizer=stateless_adam", "trainer.max_steps=3", "trainer.save_interval=0", "trainer.nproc=1")
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = checkpoint.load(run)
    assert ckpt.step == 3 and ckpt.optimizer_state is None
    assert not (ckpt.path / "optimizer.pt").exists()
    assert ckpt.metadata["optimizer"] == "stateless_adam"


def test_opd_student_learns_from_teacher_with_zero_task_reward(tmp_path, tmp_path_factory):
    """A quickstart-trained teacher serves a fresh student; pure distillation closes the gap."""
    from tests.helpers import free_port

    teacher_run, _ = quickstart_run(tmp_path_factory)
    teacher_reward = sum(r["reward/mean"] for r in metrics(teacher_run)[-5:]) / 5
    student_run = tmp_path / "student"
    out = run_train(student_run, "+recipe=opd", f"teacher.model_path={teacher_run / 'final'}",
                    f"teacher.port={free_port()}", "trainer.max_steps=45", "trainer.save_interval=0")
    assert out.returncode == 0, out.stdout[-3000:]
    rows = metrics(student_run)
    assert all(r["reward/mean"] is not None for r in rows)  # the task reward is logged, not trained on
    gaps = [r["opd/student_teacher_gap"] for r in rows]
    # the gap falls steadily, then collapses once the student finds the teacher's answers; when that comes
    # varies from run to run (the last 3 steps' gap was 0.04x to 0.64x the first 3's): no learning stays ~1x
    assert sum(gaps[-3:]) / 3 < 0.75 * sum(gaps[:3]) / 3, gaps
    assert rows[-1]["opd/teacher_logp_mean"] > rows[0]["opd/teacher_logp_mean"]
    student_reward = sum(r["reward/mean"] for r in rows[-3:]) / 3
    assert student_reward > 3 * rows[0]["reward/mean"] and student_reward > 0.25 * teacher_reward, (
        student_reward, teacher_reward)


def test_opd_rejects_a_teacher_with_another_tokenizer(tmp_path):
    from slimecli.model.tiny import create_tiny_model
    from tests.helpers import run_cli

    other = create_tiny_model(tmp_path / "other", seed=1)
    tok = other / "tokenizer.json"
    import json

    from slimecli.model.loading import load_tokenizer
    from slimecli.teacher.client import PROBE_TEXT

    data = json.loads(tok.read_text())
    vocab = data["model"]["vocab"]
    first_ids = load_tokenizer(other).encode(PROBE_TEXT, add_special_tokens=False)
    by_id = {v: k for k, v in vocab.items()}
    a, b = by_id[first_ids[0]], by_id[next(i for i in first_ids if i != first_ids[0])]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, different ids
    tok.write_text(json.dumps(data))
    out = run_cli("train", "+recipe=opd", f"teacher.model_path={other}", f"run.root={tmp_path / 'runs'}")
    assert out.returncode == 2 and "teacher.model_path" in out.stderr and str(other) in out.stderr, out.stderr


def test_fsdp_trains_checkpoints_and_resumes(tmp_path):
    """trainer.strategy=fsdp (FSDP2 over gloo on CPU): weights gathered for sync, checkpoint, resume."""
    run = tmp_path / "f"
    out = run_train(run, "trainer.strategy=fsdp", "trainer.max_steps=2", "trainer.save_interval=1")
    assert out.returncode == 0, out.stdout[-3000:]
    first = checkpoint.load(run)
    assert first.step == 2 and first.optimizer_state is not None
    out = run_train(run, "trainer.strategy=fsdp", "trainer.max_steps=4", "trainer.save_interval=1")
    assert out.returncode == 0 and "resuming" in out.stdout, out.stdout[-3000:]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]
    assert all(r["weight_version"] == r["step"] for r in metrics(run))
    assert (run / "final" / "model.safetensors").is_file()


def test_trainer_rank_kill_stops_the_run_then_resumes(tmp_path):
    """kill -9 of a trainer rank: the controller names the trainer and exits; the same command resumes."""
    run = tmp_path / "t"
    args = ("trainer.max_steps=6", "trainer.save_interval=1")
    proc = start_train(run, *args)
    try:
        wait_until(lambda: checkpoint.latest_complete(run) is not None, 300, "a first checkpoint", proc=proc)
        children = descendants(proc.pid)
        ranks = [p for p in children if b"-m\x00slimecli.train" in cmdline(p) and b"torch.distributed.run" not in cmdline(p)]
        assert len(ranks) == 2, [(cmdline(p)) for p in children]
        os.kill(ranks[1], signal.SIGKILL)
        code = proc.wait(timeout=60)
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert code != 0 and "trainer exited" in output
    assert wait_dead(children, timeout=15) == []
    out = run_train(run, *args)
    assert out.returncode == 0 and "resuming" in out.stdout, out.stdout[-3000:]
    assert [r["step"] for r in metrics(run)] == list(range(1, 7))
