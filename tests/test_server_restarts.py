"""Servers that die or hang mid-run are restarted (launch/restarts.py) and a restarted engine gets the current weights
before it generates (train/coordinator/recovery.py): the run goes on with no command from the user."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web

from slimecli.config.compose import load
from slimecli.launch.spec import Health
from slimecli.launch.supervisor import Supervisor
from slimecli.observe.restarts import RESTARTS_FILE
from slimecli.rollout.client import EngineClient
from slimecli.train.coordinator.recovery import EngineRecovery
from tests.helpers import ROOT, free_port, wait_dead, wait_until
from tests.helpers.train_e2e import cmdline, descendants, kill_tree, metrics
from tests.test_launch_supervisor import pids_of, server_spec, worker_spec

STANDIN = ROOT / "tests" / "helpers" / "sglang_standin"  # `python -m sglang.launch_server` served by slimecli's engine


def fast_health(port: int, restarts: int) -> Health:
    return Health(f"http://127.0.0.1:{port}/", interval_s=0.2, timeout_s=1.5, start_grace_s=0.0, max_restarts=restarts,
                  setting="srv.max_restarts")


@pytest.mark.slow
def test_a_killed_server_is_restarted_and_a_stopped_one_past_the_budget_ends_the_run(tmp_path, capsys):
    """kill -9: the same command again on the same port, its log kept, the restart recorded; then SIGSTOP of the
    new process: declared hung after the health timeout, its stacks asked for, and with the budget spent the run
    stops naming it, the budget and its log."""
    port = free_port()
    sup = Supervisor([server_spec(tmp_path, "srv", port, health=fast_health(port, 1)),
                      worker_spec("work", "import time; time.sleep(120)")], tmp_path / "logs", grace_s=3,
                     restart_log=tmp_path / RESTARTS_FILE)
    seen: list[int] = []

    def faults() -> None:
        wait_until(lambda: any(c.spec.name == "work" for c in sup.children), 60, "the worker to start")
        first = pids_of(tmp_path, "srv", 2)[0]
        seen.append(first)
        (tmp_path / "srv.pids").unlink()
        os.kill(first, signal.SIGKILL)
        second = pids_of(tmp_path, "srv", 2)[0]  # the restarted server wrote its own
        seen.append(second)
        wait_until(lambda: "srv" in sup.probes and sup.probes["srv"].ready, 60, "the restarted server to be ready")
        os.kill(second, signal.SIGSTOP)

    threading.Thread(target=faults, daemon=True).start()
    assert sup.run() == 1
    out = capsys.readouterr().out
    assert "srv was killed by SIGKILL (exit code -9): restarting it (restart 1 of srv.max_restarts=1)" in out, out
    assert len(seen) == 2 and seen[0] != seen[1]
    assert "srv is hung: no answer from" in out and "after 1 restart (srv.max_restarts=1 spent)" in out, out
    assert "its stacks could not be taken" in out
    logs = tmp_path / "logs"
    assert (logs / "srv.0.log").is_file() and (logs / "srv.log").is_file()
    assert "its stacks could not be taken" in (logs / "srv.log").read_text()
    (line,) = (tmp_path / RESTARTS_FILE).read_text().splitlines()
    assert json.loads(line)["server"] == "srv" and json.loads(line)["restart"] == 1
    assert wait_dead(seen) == []


def test_a_server_that_hangs_right_after_it_is_ready_counts_as_hung_not_as_loading(tmp_path, capsys):
    """A server the workers start beside (awaited_by_workers) is said ready by its readiness probe; a hang at once,
    before the health probe's own first answer, is a hang after health.timeout_s, not a start-up that may take
    start_timeout_s."""
    port = free_port()
    health = Health(f"http://127.0.0.1:{port}/", interval_s=120.0, timeout_s=1.5, start_grace_s=0.0, max_restarts=0,
                    setting="srv.max_restarts")  # its first probe (refused: not up yet) is its last in this test
    sup = Supervisor([server_spec(tmp_path, "srv", port, health=health, start_timeout_s=600, awaited_by_workers=True),
                      worker_spec("work", "import time; time.sleep(120)")], tmp_path / "logs", grace_s=3)

    def hang() -> None:
        wait_until(lambda: "srv" in sup.probes and sup.probes["srv"].ready, 60, "srv said ready")
        os.kill(pids_of(tmp_path, "srv")[0], signal.SIGSTOP)

    threading.Thread(target=hang, daemon=True).start()
    assert sup.run() == 1
    out = capsys.readouterr().out
    assert "srv is ready" in out and "srv is hung: no answer from" in out, out
    assert "not ready within" not in out, out


def read_lines(proc: subprocess.Popen, lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)


def train(run: Path, env: dict[str, str], *overrides: str) -> tuple[subprocess.Popen, list[str]]:
    """`slimecli train` on one trainer rank with ``env`` added, and the list its output lines go to as they come."""
    proc = subprocess.Popen([sys.executable, "-m", "slimecli", "train", f"run.dir={run}", "observe.report=false",
                             "trainer.nproc=1", *overrides], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env={**os.environ, **env})
    lines: list[str] = []
    threading.Thread(target=read_lines, args=(proc, lines), daemon=True).start()
    return proc, lines


def server_pid(proc: subprocess.Popen, marker: bytes) -> int:
    (pid,) = [p for p in descendants(proc.pid) if marker in cmdline(p)]
    return pid


def said_ready(proc: subprocess.Popen, lines: list[str], times: int) -> None:
    """Once the supervisor has said ``times`` times that engine-0 is ready (its start, then each restart)."""
    waiting(lambda: proc.poll() is not None or sum("| engine-0 is ready" in x for x in lines) >= times,
            f"engine-0 ready {times} times", lines)
    assert proc.poll() is None, "".join(lines)[-3000:]


def at_step(run: Path, step: int, proc: subprocess.Popen, lines: list[str]) -> None:
    """Once the run has logged ``step`` (or the command ended, which the assertion then shows)."""
    def reached() -> bool:
        return proc.poll() is not None or (run / "metrics.jsonl").exists() and len(metrics(run)) >= step

    waiting(reached, f"step {step}", lines)
    assert proc.poll() is None, "".join(lines)[-3000:]


def waiting(predicate: Callable[[], bool], what: str, lines: list[str], timeout: float = 300) -> None:
    """wait_until, and on its timeout the run's output so far: what it was doing when the wait gave up."""
    try:
        wait_until(predicate, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the run's output so far:\n{''.join(lines)[-6000:]}") from None


STEPS = 40  # room for the faults after each restart: a forked engine is back within a second and a step takes 0.1 s


@pytest.mark.slow
def test_engine_hung_then_stopped_then_a_trainer_rank_killed_the_run_completes(tmp_path):
    """The quickstart, three faults in one run: the engine's scheduler thread blocked after step 2 (a test hook), the
    restarted engine SIGSTOPped once it is ready, then the trainer rank killed a step later. Each hang is detected by the
    engine's health probe and restarted: the blocked one's stacks are in its kept log, the stopped one's log says
    they could not be taken, and each restarted engine got the current weights before it generated. The dead rank
    is resumed from its checkpoint by the controller (run.max_restarts=1), its attempt's logs kept apart. Every
    step completes once; the metrics count 2 server restarts and 1 run restart."""
    run, marker = tmp_path / "run", tmp_path / "hang-now"
    proc, lines = train(run, {"SLIMECLI_TEST_ENGINE_HANG": str(marker)}, f"trainer.max_steps={STEPS}",
                        "trainer.save_interval=1", "run.max_restarts=1", "rollout.health_interval_s=1",
                        "rollout.health_timeout_s=5", "rollout.health_start_grace_s=0")
    try:
        at_step(run, 2, proc, lines)
        said_ready(proc, lines, 1)  # hung before the supervisor saw it ready, it would count as still loading
        marker.touch()  # the next /generate blocks the scheduler thread for good
        said_ready(proc, lines, 2)  # the restarted engine, as its health probe found it: stopped only now
        os.kill(server_pid(proc, b"-m\x00slimecli.engine"), signal.SIGSTOP)
        said_ready(proc, lines, 3)
        at_step(run, len(metrics(run)) + 1, proc, lines)
        os.kill(server_pid(proc, b"-m\x00slimecli.train"), signal.SIGKILL)
        waiting(lambda: proc.poll() is not None, "the run's end", lines, timeout=400)
        assert proc.returncode == 0, "".join(lines)[-4000:]
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    output = "".join(lines)
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), output[-3000:]
    assert rows[0]["run/server_restarts"] == 0 and rows[-1]["run/server_restarts"] == 2
    assert rows[0]["run/restarts"] == 0 and rows[-1]["run/restarts"] == 1
    streamed = [line for line in lines if line.lstrip().startswith(("slimecli |", "trainer |"))]  # not log tails
    assert sum("engine-0 is hung" in x for x in streamed) == 2, output[-4000:]
    # two restarts, each waited for: where the second came while the first's recovery gave the weights (the engine
    # stopped between its readiness and the weights' request), one recovery waited for both
    back, again = (sum(what in x for x in streamed) for what in ("is back, serving weight version", "went away again"))
    assert back >= 1 and back + again == 2, output[-4000:]
    assert "restarting the run (restart 1 of run.max_restarts=1) from step" in output, output[-4000:]
    failed_attempt = run / "logs" / "attempt-0"  # the engine's logs of the attempt the dead rank ended
    hung = (failed_attempt / "engine-0.0.log").read_text()
    assert "SLIMECLI_TEST_ENGINE_HANG: blocking" in hung and "stacks written to its log" in hung
    assert "slimecli/engine/scheduler.py" in hung  # faulthandler's dump: the blocked scheduler thread
    assert "stopped (SIGSTOP): its stacks could not be taken" in (failed_attempt / "engine-0.1.log").read_text()
    assert (failed_attempt / "trainer.log").is_file() and (run / "logs" / "trainer.log").is_file()
    assert [json.loads(x)["server"] for x in (run / RESTARTS_FILE).read_text().splitlines()] == ["engine-0"] * 2


def test_a_server_ready_for_a_moment_then_hung_counts_as_hung_not_as_loading():
    """A server that answers its health probe for a fraction of a second and then never again (its first request
    blocked it): the probe of a server not yet ready polls fast enough to see it ready, so the hang is found after
    health.timeout_s, not after the start timeout (the probe's interval here is 30 s)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from slimecli.launch.restarts import HealthProbe

    opened = threading.Event()
    started = [0.0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            elapsed = time.monotonic() - started[0]
            if elapsed < 0.3:
                self.send_response(503)
            elif elapsed < 0.6:
                self.send_response(200)
            else:
                opened.wait(5)  # hung: no answer
                return
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    health = Health(f"http://127.0.0.1:{server.server_address[1]}/", interval_s=30.0, timeout_s=1.0,
                    start_grace_s=0.0, max_restarts=1)
    started[0] = time.monotonic()
    probe = HealthProbe(health, start_timeout_s=600.0, ready=False)
    try:
        wait_until(lambda: probe.ready, 5, "the probe to see the server ready")
        wait_until(lambda: probe.trouble() is not None, 5, "the hang to be found")
        assert (probe.trouble() or "").startswith("hung: no answer")
    finally:
        probe.stop()
        opened.set()
        server.shutdown()
        server.server_close()


def test_an_engine_lost_again_while_it_is_given_the_weights_is_waited_for_again(caplog):
    """A recovery's own weights request reset by the engine's second restart (a real loopback server that drops the
    first /update_weight_version): the recovery waits for the engine again and gives it the weights then."""
    seen: list[str] = []

    async def health(request: web.Request) -> web.Response:
        seen.append("health")
        return web.json_response({})

    async def version(request: web.Request) -> web.Response:
        seen.append("weights")
        if seen.count("weights") == 1:
            assert request.transport is not None
            request.transport.abort()  # the connection reset, as a killed engine's is
        return web.json_response({"success": True})

    async def scenario() -> int:
        app = web.Application()
        app.add_routes([web.get("/health_generate", health), web.post("/update_weight_version", version)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        weights = SimpleNamespace(resync=lambda engine: engine.update_weight_version("v0"))
        recovery = EngineRecovery(load([]), weights)
        try:
            async with EngineClient(f"http://127.0.0.1:{port}") as client:
                client.recovery = recovery
                await client._recover()
        finally:
            await runner.cleanup()
        return recovery.recovered

    with caplog.at_level(logging.WARNING, logger="slimecli.train"):
        assert asyncio.run(scenario()) == 1
    assert seen == ["health", "weights", "health", "weights"]
    assert "went away again before it took the weights" in caplog.text and "is back, serving weight version" in caplog.text


@pytest.mark.slow
def test_sglang_engine_killed_mid_run_is_restarted_and_given_the_weights(tmp_path):
    """rollout=sglang's argv path (`python -m sglang.launch_server`, a stand-in served by slimecli's engine, which
    like SGLang serves its --model-path at once after a restart): kill -9 at step 2 of 5; the trainer notices from
    the lost connections, waits for the restart and re-sends the weights; every step completes once."""
    run = tmp_path / "run"
    env_path = os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")])
    proc, lines = train(run, {"PYTHONPATH": env_path}, "rollout=sglang", "trainer.max_steps=5")
    try:
        at_step(run, 2, proc, lines)
        os.kill(server_pid(proc, b"rollout\x00serve"), signal.SIGKILL)  # the stand-in, exec'd
        assert proc.wait(timeout=300) == 0, "".join(lines)[-4000:]
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    output = "".join(lines)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["run/server_restarts"] == 1, output[-3000:]
    assert "engine-0 was killed by SIGKILL" in output and "is back, serving weight version" in output, output[-3000:]
