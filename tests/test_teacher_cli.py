"""`slimecli teacher serve`: refuses what it cannot serve before starting any rank; runs supervised."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from slimecli.process import children
from tests.helpers import invoke_cli, wait_dead, wait_until
from tests.helpers.cli_tree import listed_commands
from tests.helpers.teacher import Server


def test_serve_needs_a_checkpoint_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    r = invoke_cli("teacher", "serve", f"teacher.model_path={tmp_path / 'empty'}", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2
    assert f"teacher.model_path: not a Hugging Face checkpoint (no config.json) (got '{tmp_path / 'empty'}')" \
        in r.stderr
    assert not (tmp_path / "run").exists()
    r = invoke_cli("teacher", "serve", f"model.path={tmp_path / 'nope'}", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 2 and str(tmp_path / "nope") in r.stderr


def test_serve_reports_config_errors(tmp_path):
    r = invoke_cli("teacher", "serve", "teacher.tp=0", "teacher.sample_chunk_size=-1", f"model.path={tmp_path}")
    assert r.returncode == 2
    assert "teacher.tp" in r.stderr and "teacher.sample_chunk_size" in r.stderr


def test_teacher_help_lists_serve():
    r = invoke_cli("teacher", "--help", env={"COLUMNS": "120"})
    assert r.returncode == 0 and listed_commands(r.stdout) == ["serve"]  # a row of the Commands panel, not a word
    serve = invoke_cli("teacher", "serve", "--help", env={"COLUMNS": "120"})
    assert serve.returncode == 0 and "Usage: slimecli teacher serve" in serve.stdout


def test_server_fields_are_validated():
    r = invoke_cli("config", "validate", "teacher.dtype=int8", "teacher.keepalive_s=0", "teacher.log_interval_s=-1")
    assert r.returncode == 2
    for key in ("teacher.dtype", "teacher.keepalive_s", "teacher.log_interval_s"):
        assert key in r.stderr


def _descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *_descendants(child)]
    return found


@pytest.mark.slow
def test_serve_is_supervised_and_stops_with_its_ranks(tmp_path):
    """The teacher runs under the same plan and supervisor as `slimecli train`'s: prefixed logs, a log file,
    plan.json, and SIGTERM to the command takes the ranks' launcher and every rank down."""
    srv = Server(tmp_path, ["teacher.tp=2"])
    try:
        srv.wait_ready()
        ranks = _descendants(srv.proc.pid)
        assert len(ranks) >= 3  # the launcher (behind the exec wrapper) and two ranks
        run = tmp_path / f"run-{srv.port}"
        assert [s["name"] for s in json.loads((run / "plan.json").read_text())] == ["teacher"]
        # the supervisor's own probe may answer a moment after the test's
        wait_until(lambda: "teacher is ready" in srv.read_log(), 30, "the supervisor's readiness line", proc=srv.proc)
        assert "   teacher |" in srv.read_log()
        assert (run / "logs" / "teacher.log").stat().st_size > 0
        os.kill(srv.proc.pid, signal.SIGTERM)
        assert srv.proc.wait(60) == 128 + signal.SIGTERM
        assert wait_dead(ranks, 30) == []
    finally:
        srv.stop()


@pytest.mark.slow
def test_a_rank_that_dies_is_restarted_then_past_the_budget_ends_serve_with_one_clear_message(tmp_path):
    """teacher.max_restarts=1: the first death is restarted (serve goes on, /healthz answers again), the second ends
    serve naming the teacher, the spent budget and its log."""
    srv = Server(tmp_path, ["teacher.max_restarts=1"])

    def rank() -> int:
        return next(p for p in _descendants(srv.proc.pid) if "slimecli.teacher" in Path(f"/proc/{p}/cmdline")
                    .read_bytes().decode(errors="replace") and not children(p))

    try:
        srv.wait_ready()
        first = rank()
        os.kill(first, signal.SIGKILL)  # one rank runs without torchrun (tp=1): its own death is the teacher's
        wait_until(lambda: "restarting it (restart 1 of teacher.max_restarts=1)" in srv.read_log(), 60, "a restart")
        srv.wait_ready()
        assert rank() != first and srv.proc.poll() is None
        os.kill(rank(), signal.SIGKILL)
        assert srv.proc.wait(60) == 1
        log = srv.read_log()
        assert "teacher failed (killed by SIGKILL" in log and "logs/teacher.log" in log, log[-2000:]
        assert "after 1 restart (teacher.max_restarts=1 spent)" in log, log[-2000:]
    finally:
        srv.stop()
