"""Faults in real `slimecli train` runs on CPU: a checkpoint damaged by hand is skipped with a warning naming
it (exit 2 naming the file when none is left), and kill -9 of the teacher server mid-run is followed by the
same command finishing the run, each step in metrics.jsonl exactly once."""

from __future__ import annotations

import os
import signal

import pytest

from slimecli.checkpoint import store as checkpoint
from tests.helpers import free_port, wait_dead, wait_until
from tests.helpers.train_e2e import cmdline, descendants, kill_tree, metrics, run_train, start_train

pytestmark = pytest.mark.slow


def garble(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = os.urandom(64)
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_skipped_and_none_left_is_exit_2(tmp_path):
    run = tmp_path / "d"
    out = run_train(run, "trainer.max_steps=3", "trainer.save_interval=1", "trainer.nproc=1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    step_2, step_3 = run / "checkpoints" / "step_2", run / "checkpoints" / "step_3"
    garble(step_3 / "model.safetensors")  # garbage bytes, same size, marker kept

    out = run_train(run, "trainer.max_steps=4", "trainer.save_interval=1", "trainer.nproc=1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"checkpoint {step_3} is damaged (model.safetensors does not match its recorded SHA-256); skipped" in out.stdout
    assert f"resuming from the previous complete checkpoint {step_2}" in out.stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]  # step 3 trained again, listed once
    assert checkpoint.latest_complete(run).name == "step_4"

    for step in checkpoint.step_dirs(run):
        (step[1] / "optimizer.pt").unlink()
    out = run_train(run, "trainer.max_steps=5", "trainer.save_interval=1", "trainer.nproc=1")
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert "damaged checkpoint: optimizer.pt is missing" in out.stderr and str(run / "checkpoints" / "step_4") in out.stderr
    assert "Traceback" not in out.stdout + out.stderr and "torchrun" not in out.stdout + out.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_teacher_kill_stops_the_run_then_the_same_command_finishes(tmp_path):
    from slimecli.model.tiny import create_tiny_model

    teacher = create_tiny_model(tmp_path / "teacher", seed=1)  # the student's tokenizer, other weights
    run = tmp_path / "opd"
    args = ("+recipe=opd", f"teacher.model_path={teacher}", f"teacher.port={free_port()}", "trainer.max_steps=5",
            "trainer.save_interval=1", "trainer.nproc=1")
    proc = start_train(run, *args)
    try:
        wait_until(lambda: checkpoint.latest_complete(run) is not None, 600, "a first checkpoint", proc=proc)
        children = descendants(proc.pid)
        servers = [p for p in children if b"slimecli.teacher" in cmdline(p) and b"torch.distributed.run" not in cmdline(p)]
        assert servers, [cmdline(p) for p in children]
        os.kill(servers[0], signal.SIGKILL)
        code = proc.wait(timeout=120)
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert code != 0
    summaries = [line for line in output.splitlines() if line.startswith("teacher failed")]
    assert summaries and "killed by SIGKILL" in summaries[-1] and "full log:" in summaries[-1], output[-3000:]
    assert wait_dead(children, timeout=15) == []
    out = run_train(run, *args)
    assert out.returncode == 0 and "resuming" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert [r["step"] for r in metrics(run)] == list(range(1, 6))
