"""Rank-local failures of a real tp=2 teacher (`slimecli teacher serve` under torchrun), sent through its HTTP API:
a failure that only one rank sees after the request was accepted is agreed by both ranks and answered 4xx/5xx,
and the next valid request gets the same log-probs as before; a rank that fails between the TP collectives takes
the whole server down (the supervisor says so) and /healthz never says 200 meanwhile; a call stuck past the bound
makes /healthz 503. In process: a DP group whose exchange raised (a dead peer) is never used again, and what
waited for it is answered 503.

The overflow case is a real input (a checkpoint whose token 1000, held by rank 1 only, has ~1e29 logits, and an
allowed temperature of 0.01); a forward that raises and a failure between collectives cannot be reached by input,
so they use the test hook `test_fail` (SLIMECLI_TEACHER_TEST_HOOKS=1).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from slimecli.config.schema import SlimeConfig
from slimecli.teacher.server import Front
from tests.helpers import wait_until, wait_until_async
from tests.helpers.teacher import VOCAB, Server, make_checkpoint

BOUND_S = 3.0  # teacher.request_timeout_s: a call running longer makes /healthz 503
IDS = [1, 5, 7, 9]
VALID = {"input_ids": IDS, "sample_n": 2, "label_token_ids": [[1, 2], [3, VOCAB - 1], [5, 6]]}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """The module's teacher servers, newest last: one unless a test took it down."""
    started: list[Server] = []
    yield started
    for srv in started:
        srv.stop()


@pytest.fixture
def server(servers: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    """A live tp=2 teacher: the module's, or a new one when a test has stopped it (the failure between
    collectives does, by design), so the tests hold in any order."""
    if not servers or servers[-1].proc.poll() is not None:
        tmp = tmp_path_factory.mktemp("teacher_rank_failure")
        ckpt = make_checkpoint(tmp / "loud", seed=1, loud_token=VOCAB - 1)  # the last token: rank 1's slice
        # teacher.max_restarts=0: what the server itself does when a rank fails, not the supervisor's restart of it
        # (tests/test_teacher_cli.py)
        srv = Server(tmp, [f"teacher.model_path={ckpt}", "teacher.tp=2", f"teacher.request_timeout_s={BOUND_S}",
                           "teacher.max_restarts=0"], env={"SLIMECLI_TEACHER_TEST_HOOKS": "1"})
        servers.append(srv)
        srv.wait_ready()
    return servers[-1]


def generate(srv: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + "/generate", json=body, timeout=60)


def healthz(srv: Server) -> httpx.Response:
    return httpx.get(srv.url + "/healthz", timeout=5)


def scores(srv: Server) -> tuple[list[float], list[list[float]]]:
    r = generate(srv, VALID)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["log_probs"], out["label_token_log_probs"]


@pytest.mark.slow
def test_overflow_seen_by_one_rank_is_a_400_from_both_then_same_log_probs(server: Server) -> None:
    before = scores(server)
    r = generate(server, {"input_ids": IDS, "temperature": 0.01})  # valid at the front; overflows on rank 1 only
    assert r.status_code == 400, r.text
    assert "too small for this model's logits" in r.json()["error"]
    assert scores(server) == before  # both ranks still in step: the refusal came before any collective
    assert healthz(server).json() == {"ok": True}


@pytest.mark.slow
@pytest.mark.parametrize("tp_rank, words", [(0, "test fault in the forward"), (1, "forward failed on a TP peer")])
def test_forward_failing_on_one_rank_is_a_500_then_same_log_probs(server: Server, tp_rank: int, words: str) -> None:
    before = scores(server)
    r = generate(server, {**VALID, "test_fail": {"tp_rank": tp_rank, "at": "forward"}})
    assert r.status_code == 500, r.text
    assert words in r.json()["error"]
    assert scores(server) == before
    assert healthz(server).status_code == 200


@pytest.mark.slow
def test_healthz_is_503_while_a_call_runs_past_the_bound(server: Server) -> None:
    assert healthz(server).status_code == 200
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(generate, server, {**VALID, "test_delay_s": BOUND_S + 4})
        sick = wait_until(lambda: healthz(server).status_code == 503 and healthz(server).json(), BOUND_S + 3,
                          "/healthz to answer 503")
        assert sick["ok"] is False and "in one call" in sick["error"], sick
        assert slow.result().status_code == 200  # slow, not broken: it ends, and so does the 503
    assert healthz(server).json() == {"ok": True}


@pytest.mark.slow
def test_failure_between_collectives_stops_the_server(server: Server) -> None:
    """The server does not survive it (by design: the peers would hang in the collective); a later test gets a
    new one."""
    try:
        r = generate(server, {**VALID, "test_fail": {"tp_rank": 1, "at": "collective"}})
        assert r.status_code >= 500, r.text
    except httpx.HTTPError:
        pass  # rank 0 stopped while the request was in it: no answer, the connection closed
    deadline = time.monotonic() + 120
    while server.proc.poll() is None and time.monotonic() < deadline:
        try:
            assert healthz(server).status_code != 200, "/healthz said healthy after a rank failed in a collective"
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    assert server.proc.poll() not in (None, 0)
    log = server.read_log()
    assert "failed inside a TP collective" in log
    assert "teacher exited" in log  # the supervisor names the server that died


def test_a_broken_group_is_not_used_again_and_what_waited_is_answered() -> None:
    """The exchange raises (as _bcast does when a peer died): the front must neither say healthy nor queue
    requests for a group that will never answer."""
    release = threading.Event()

    def exchange(msg: dict[str, Any]) -> dict[str, Any]:
        release.wait(30)
        raise ConnectionError("Connection closed by peer")

    async def run() -> None:
        cfg = SlimeConfig()
        front = Front(replace(cfg, teacher=replace(cfg.teacher, tp=2)), [exchange], VOCAB, "/nonexistent/ckpt")
        async with TestClient(TestServer(front.app())) as client:
            front.start_background()
            assert (await client.get("/healthz")).status == 200
            async def running() -> bool:
                return front.running == 1

            async def queued() -> bool:
                return front.queued == 1

            first = asyncio.create_task(client.post("/generate", json={"input_ids": IDS}))
            await wait_until_async(running, 10, "the first request to run")
            second = asyncio.create_task(client.post("/generate", json={"input_ids": IDS}))
            await wait_until_async(queued, 10, "the second to queue")
            release.set()
            r1, r2 = await first, await second
            assert r1.status == 500 and "Connection closed by peer" in (await r1.json())["error"]
            assert r2.status == 503 and "DP group 0 is broken" in (await r2.json())["error"]
            health = await client.get("/healthz")
            assert health.status == 503 and "DP group 0 is broken" in (await health.json())["error"]
            r3 = await client.post("/generate", json={"input_ids": IDS})
            assert r3.status == 503 and "cannot serve" in (await r3.json())["error"]
            assert front.queued == 0 and front.pending_tokens == 0

    asyncio.run(run())
