"""run.max_restarts: a trainer rank that dies is resumed from the newest checkpoint by the controller itself."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch.controller import _restartable
from tests.helpers import wait_until
from tests.helpers.train_e2e import descendants, kill_tree, metrics, rank_pids, start_train

STEPS = 6
ARGS = ("trainer.nproc=1", f"trainer.max_steps={STEPS}", "trainer.save_interval=1", "run.max_restarts=1",
        "eval.at_start=false", "eval.at_end=false")


def test_what_is_restarted():
    cfg = load([])
    assert _restartable(cfg, "worker") and not _restartable(cfg, "server") and not _restartable(cfg, None)
    assert not _restartable(cfg, "stall")
    assert _restartable(load(["run.on_stall=restart", "run.max_restarts=1"]), "stall")
    with pytest.raises(ConfigErrors, match="run.on_stall: restarts within run.max_restarts, which is 0"):
        load(["run.on_stall=restart"])


@pytest.mark.slow
def test_a_killed_trainer_rank_is_resumed_by_the_controller_and_every_step_is_logged_once(tmp_path):
    run = tmp_path / "r"
    proc = start_train(run, *ARGS)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: proc.poll() is not None or any(f"train step 3/{STEPS}" in x for x in lines), 300, "step 3")
        (rank,) = rank_pids(descendants(proc.pid))
        os.kill(rank, signal.SIGKILL)
        assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    reader.join(timeout=30)
    out = "".join(lines)
    assert "restarting the run (restart 1 of run.max_restarts=1) from step" in out, out[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # each step once
    assert rows[0]["run/restarts"] == 0 and rows[-1]["run/restarts"] == 1
    assert (run / "logs" / "attempt-0" / "trainer.log").is_file()  # the failed attempt's logs, kept apart
    assert (run / "logs" / "trainer.log").is_file() and (run / "final" / "model.safetensors").is_file()
