"""Faults in real `slimecli train` runs on CPU, in turn in one run dir: kill -9 of the teacher server mid-run (it is
restarted and the run completes), then its newest checkpoint damaged by hand, and the same command finishes the run (the damaged checkpoint skipped
with a warning naming it, each step in metrics.jsonl exactly once); exit 2 naming the file when none is left."""

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


def test_teacher_kill_then_a_damaged_checkpoint_then_none_usable(tmp_path):
    """Three faults in turn in one OPD run dir: kill -9 of the teacher server mid-run: the supervisor restarts it,
    the trainer's requests wait for it, and the run completes (the metrics count the restart); its newest
    checkpoint damaged by hand is skipped by the same command with a warning naming it, which resumes from the one
    before and finishes; with no usable checkpoint left, exit 2 naming the file."""
    from slimecli.model.tiny import create_tiny_model

    teacher = create_tiny_model(tmp_path / "teacher", seed=1)  # the student's tokenizer, other weights
    run = tmp_path / "opd"
    opd = ("+recipe=opd", f"teacher.model_path={teacher}", f"teacher.port={free_port()}", "trainer.save_interval=1",
           "trainer.nproc=1")
    proc = start_train(run, *opd, "trainer.max_steps=5")
    try:
        wait_until(lambda: (found := checkpoint.latest_complete(run)) is not None and found.name != "step_1", 600,
                   "a second checkpoint", proc=proc)
        children = descendants(proc.pid)
        servers = [p for p in children if b"slimecli.teacher" in cmdline(p) and b"torch.distributed.run" not in cmdline(p)]
        assert servers, [cmdline(p) for p in children]
        os.kill(servers[0], signal.SIGKILL)
        code = proc.wait(timeout=600)
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert code == 0, output[-3000:]
    assert "teacher was killed by SIGKILL (exit code -9): restarting it (restart 1 of teacher.max_restarts=2)" in output
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["run/server_restarts"] == 1, output[-3000:]
    assert wait_dead(children, timeout=15) == []

    newest = checkpoint.latest_complete(run)
    previous = run / "checkpoints" / f"step_{checkpoint.load(run).step - 1}"
    garble(newest / "model.safetensors")  # garbage bytes, same size, marker kept
    out = run_train(run, *opd, "trainer.max_steps=5")  # the same command: step 5 again, from step 4's checkpoint
    assert out.returncode == 0 and "resuming" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"checkpoint {newest} is damaged (model.safetensors does not match its recorded SHA-256); skipped" in out.stdout
    assert f"resuming from the previous complete checkpoint {previous}" in out.stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5]  # the damaged step trained again, each listed once
    assert checkpoint.latest_complete(run).name == "step_5"

    for step in checkpoint.step_dirs(run):
        (step[1] / "optimizer.pt").unlink()
    out = run_train(run, *opd, "trainer.max_steps=6")
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert "damaged checkpoint: optimizer.pt is missing" in out.stderr and str(run / "checkpoints" / "step_5") in out.stderr
    assert "Traceback" not in out.stdout + out.stderr and "torchrun" not in out.stdout + out.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5]
