"""run.max_restarts: a trainer rank that dies is resumed from the newest checkpoint by the controller itself."""

from __future__ import annotations

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.launch.controller import _restartable

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


# A trainer rank killed mid-run and resumed by the controller: in tests/test_server_restarts.py, in the run whose
# engine hangs twice before (one run for every fault).
