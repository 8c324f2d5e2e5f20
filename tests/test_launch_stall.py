"""The progress watchdog (launch/stall.py): a run that completes no step within run.stall_timeout_s has every
process's Python stacks written to its log, and fails naming them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slimecli.launch.stall import StallWatch, dump_stacks
from slimecli.process import state
from tests.helpers import wait_until


def test_the_watch_counts_from_the_last_change_of_the_progress_file(tmp_path: Path):
    progress = tmp_path / "metrics.jsonl"
    watch = StallWatch(progress, timeout_s=0.3)
    assert watch.stalled_for() is None
    time.sleep(0.35)
    assert watch.stalled_for() is not None  # nothing since the watch started
    progress.write_text('{"step": 1}\n')
    assert watch.stalled_for() is None  # a step: the clock starts again
    time.sleep(0.35)
    assert watch.stalled_for() >= 0.3
    assert StallWatch(progress, timeout_s=0).stalled_for() is None  # 0: never
    starting = StallWatch(tmp_path / "not-yet.jsonl", timeout_s=0.1, start_grace_s=0.5)
    time.sleep(0.2)
    assert starting.stalled_for() is None  # the trainer is not up yet: the grace as well
    resumed = StallWatch(progress, timeout_s=0.1, start_grace_s=0.5)  # a resumed run's file is there already
    time.sleep(0.2)
    assert resumed.stalled_for() is None  # the grace holds until the file changes
    fresh = tmp_path / "fresh.jsonl"
    first = StallWatch(fresh, timeout_s=0.1, start_grace_s=0.6)
    fresh.touch()  # the trainer opened its records: the first step (its warm-up) still has the grace
    assert first.stalled_for() is None
    time.sleep(0.3)
    assert first.stalled_for() is None
    fresh.write_text('{"step": 1}\n')  # the first row: from now on timeout_s alone
    assert first.stalled_for() is None
    time.sleep(0.15)
    assert first.stalled_for() is not None
    busy = tmp_path / "busy.jsonl"  # a loaded machine: the file created and its first row written between two looks
    late = StallWatch(busy, timeout_s=0.1, start_grace_s=60)
    busy.write_text('{"step": 1}\n')
    assert late.stalled_for() is None
    time.sleep(0.15)
    assert late.stalled_for() is not None  # a step completed: no grace left
    early = tmp_path / "early.jsonl"  # the first step done before the supervisor's watch loop began
    before = StallWatch(early, timeout_s=0.1, start_grace_s=60)
    early.write_text('{"step": 1}\n')
    time.sleep(0.15)
    before.rearm()  # the clock from now, the progress against the file as it was when the watch was made
    assert before.stalled_for() is None
    time.sleep(0.15)
    assert before.stalled_for() is not None


def test_stacks_are_asked_of_python_workers_and_a_stopped_one_is_named(tmp_path: Path):
    code = ("import faulthandler, signal, sys, time; "
            "faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True); "
            "print('up', flush=True); time.sleep(60)")
    procs = []
    for name in ("slimecli.engine", "slimecli.teacher"):  # what dump_stacks looks for in a command line
        log = open(tmp_path / f"{name}.log", "wb")  # closed below
        procs.append((subprocess.Popen([sys.executable, "-c", code, "-m", name], stdout=log, stderr=log), log))
    try:
        time.sleep(1.0)
        os.kill(procs[1][0].pid, signal.SIGSTOP)
        wait_until(lambda: state(procs[1][0].pid) == "T", 10, "the process to stop")
        said = dump_stacks([p.pid for p, _ in procs])
        assert any(f"pid {procs[0][0].pid}" in s and "stacks written" in s for s in said), said
        assert any(f"pid {procs[1][0].pid}" in s and "could not be taken" in s for s in said), said
        time.sleep(0.5)
        assert "thread 0x" in (tmp_path / "slimecli.engine.log").read_text().lower()  # "Current thread 0x...: File ..."
    finally:
        for p, log in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            log.close()


@pytest.mark.slow
def test_a_blocked_trainer_gets_every_process_stacks_dumped_and_the_run_fails(tmp_path: Path):
    run = tmp_path / "hung"
    env = {**os.environ, "SLIMECLI_TEST_HANG_AT_STEP": "2"}
    out = subprocess.run([sys.executable, "-m", "slimecli", "train", f"run.dir={run}", "trainer.nproc=1",
                          "trainer.max_steps=4", "run.stall_timeout_s=8", "eval.at_start=false", "eval.at_end=false",
                          "observe.report=false"], capture_output=True, text=True, env=env, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "no training step completed in" in out.stdout and "run.stall_timeout_s" in out.stdout
    assert "the run is stalled" in out.stdout and "stacks written to its log" in out.stdout
    trainer = (run / "logs" / "trainer.log").read_text()
    assert "thread 0x" in trainer.lower() and "hang_for_tests" in trainer and "train_step" in trainer
    assert "thread 0x" in (run / "logs" / "engine-0.log").read_text().lower()  # the engine's stacks too
    assert [line for line in (run / "metrics.jsonl").read_text().splitlines() if line]  # step 1 did complete
