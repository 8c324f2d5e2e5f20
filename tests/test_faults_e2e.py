"""Faults in real `slimecli train` runs on CPU, in turn in one run dir: kill -9 of the teacher server mid-run is
followed by the same command finishing the run, each step in metrics.jsonl exactly once; a checkpoint damaged by
hand is skipped with a warning naming it (exit 2 naming the file when none is left)."""

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
    """One OPD run dir, three faults in turn. kill -9 of the teacher server mid-run: the run stops naming it, and
    the same command finishes the run. Then the newest checkpoint damaged by hand: it is skipped with a warning
    naming it and the run resumes from the one before. Then no usable checkpoint: exit 2 naming the file."""
    from slimecli.model.tiny import create_tiny_model

    teacher = create_tiny_model(tmp_path / "teacher", seed=1)  # the student's tokenizer, other weights
    run = tmp_path / "opd"
    opd = ("+recipe=opd", f"teacher.model_path={teacher}", f"teacher.port={free_port()}", "trainer.save_interval=1",
           "trainer.nproc=1")
    proc = start_train(run, *opd, "trainer.max_steps=5")
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
    out = run_train(run, *opd, "trainer.max_steps=5")
    assert out.returncode == 0 and "resuming" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert [r["step"] for r in metrics(run)] == list(range(1, 6))

    step_4, step_5 = run / "checkpoints" / "step_4", run / "checkpoints" / "step_5"
    garble(step_5 / "model.safetensors")  # garbage bytes, same size, marker kept
    out = run_train(run, *opd, "trainer.max_steps=6")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"checkpoint {step_5} is damaged (model.safetensors does not match its recorded SHA-256); skipped" in out.stdout
    assert f"resuming from the previous complete checkpoint {step_4}" in out.stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]  # step 5 trained again, listed once
    assert checkpoint.latest_complete(run).name == "step_6"

    for step in checkpoint.step_dirs(run):
        (step[1] / "optimizer.pt").unlink()
    out = run_train(run, *opd, "trainer.max_steps=7")
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert "damaged checkpoint: optimizer.pt is missing" in out.stderr and str(run / "checkpoints" / "step_6") in out.stderr
    assert "Traceback" not in out.stdout + out.stderr and "torchrun" not in out.stdout + out.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
