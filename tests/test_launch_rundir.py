"""Run directories: unique auto names, one live command per directory, resumes that keep the run meaningful."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch import rundir
from slimecli.launch.lock import LOCK_FILE, acquire
from tests.helpers import ROOT, free_port, run_cli, wait_dead

HOLD = ("import sys, time; from pathlib import Path; from slimecli.launch.lock import acquire; "
        "acquire(Path(sys.argv[1]), 'slimecli train holder'); print('locked', flush=True); time.sleep(600)")


def holder(run_dir) -> subprocess.Popen[str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_auto_named_directories_are_unique_within_one_second(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir.time, "strftime", lambda fmt, *a: "20260101-000000")
    cfg = load([f"run.root={tmp_path}", "run.name=same"])
    first = rundir.prepare(cfg, ["slimecli", "train"], [])
    second = rundir.prepare(cfg, ["slimecli", "train"], [])
    assert first.path != second.path and not second.resumed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same-20260101-000000", "same-20260101-000000-2"]
    for run in (first, second):
        assert (run.path / "config.yaml").is_file()
        assert json.loads((run.path / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert run.lock is not None
        run.lock.release()
        assert not (run.path / LOCK_FILE).exists()


def test_a_directory_in_use_is_refused_and_a_dead_owner_is_taken_over(tmp_path):
    run_dir = tmp_path / "r"
    proc = holder(run_dir)
    try:
        cfg = load([f"run.dir={run_dir}"])
        with pytest.raises(ConfigErrors) as err:
            rundir.prepare(cfg, ["slimecli", "train"], [])
        text = err.value.render()
        assert "run.dir" in text and f"in use by pid {proc.pid}" in text and "slimecli train holder" in text
        assert not (run_dir / "config.yaml").exists()  # nothing of the live run touched
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        taken = rundir.prepare(cfg, ["slimecli", "train"], [])  # the stale lock of a dead owner
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert taken.lock is not None
        taken.lock.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_lock_is_released_when_its_command_exits(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    code = f"from pathlib import Path; from slimecli.launch.lock import acquire; acquire(Path({str(run_dir)!r}), 'x')"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert not (run_dir / LOCK_FILE).exists()
    acquire(run_dir, "y").release()


def test_a_half_written_lock_of_a_command_that_just_started_is_honoured(tmp_path):
    (tmp_path / LOCK_FILE).write_text("")
    cfg = load([f"run.dir={tmp_path}"])
    with pytest.raises(ConfigErrors, match="taking the lock now"):
        rundir.prepare(cfg, ["slimecli", "train"], [])
    old = time.time() - 60
    os.utime(tmp_path / LOCK_FILE, (old, old))  # one left by a command that died at once
    run = rundir.prepare(cfg, ["slimecli", "train"], [])
    assert run.lock is not None
    run.lock.release()


def test_resume_allows_meaningful_changes_and_refuses_another_run(tmp_path):
    run_dir = tmp_path / "r"
    base = [f"run.dir={run_dir}", "trainer.max_steps=2"]

    def prepare(*extra: str) -> rundir.RunDir:
        run = rundir.prepare(load([*base, *extra]), ["slimecli", "train"], list(extra))
        assert run.lock is not None
        run.lock.release()
        return run

    assert not prepare().resumed
    more = prepare("trainer.max_steps=5", "rollout.port=31000", "run.log_level=debug")
    assert more.resumed
    assert more.changed == ["run.log_level: 'info' -> 'debug'", "trainer.max_steps: 2 -> 5"]  # a port: no part
    layout = prepare("trainer.max_steps=5", "trainer.nproc=1", "trainer.micro_batch_size=2")  # same maths
    assert layout.resumed and "trainer.nproc: 2 -> 1" in layout.changed
    with pytest.raises(ConfigErrors) as err:
        prepare("optimizer.lr=0.5", "rollout.n_samples_per_prompt=16", "trainer.max_steps=5")
    text = err.value.render()
    assert "run.resume" in text and "optimizer.lr" in text and "rollout.n_samples_per_prompt" in text
    assert "trainer.max_steps" not in text.split("hint")[0] and "run.resume=force" in text
    assert "lr: 0.5" not in (run_dir / "config.yaml").read_text()  # the refused resume wrote nothing
    forced = prepare("optimizer.lr=0.5", "run.resume=force")
    assert forced.resumed and any(c.startswith("optimizer.lr:") for c in forced.changed)
    assert len(list(run_dir.glob("config.before-*.yaml"))) >= 1  # the previous config is kept


def test_cli_refuses_a_directory_in_use_with_one_clear_message(tmp_path):
    run_dir = tmp_path / "r"
    proc = holder(run_dir)
    try:
        r = run_cli("rollout", "serve", f"run.dir={run_dir}", f"rollout.port={free_port()}")
        assert r.returncode == 2, r.stderr
        assert f"in use by pid {proc.pid}" in r.stderr and "Traceback" not in r.stderr
    finally:
        proc.kill()
        proc.wait()
    assert wait_dead([proc.pid], 5) == []
