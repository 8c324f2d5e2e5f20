"""Teacher server with dp=2 (two DP groups of one rank, linked to rank 0) and a failing private warm-up."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest

from tests.helpers.teacher import Server, make_checkpoint, reference_log_probs


@pytest.mark.slow
def test_two_dp_groups_serve_in_parallel_and_both_reload(tmp_path):
    m1, m2 = make_checkpoint(tmp_path / "m1", seed=1), make_checkpoint(tmp_path / "m2", seed=2)
    srv = Server(tmp_path, [f"teacher.model_path={m1}", "teacher.dp=2", "teacher.keepalive_s=0.2"],
                 env={"SLIMECLI_TEACHER_TEST_HOOKS": "1"})  # keep-alive no-ops interleave with real requests
    ids = [7, 3, 9, 2]
    try:
        srv.wait_ready()

        async def run():
            async with aiohttp.ClientSession() as s:
                async def gen(delay):
                    async with s.post(srv.url + "/generate", json={"input_ids": ids, "test_delay_s": delay}) as r:
                        return r.status, await r.json()
                tasks = [asyncio.create_task(gen(1.5)) for _ in range(2)]
                peak = 0
                while not all(t.done() for t in tasks):
                    async with s.get(srv.url + "/get_loads") as r:
                        peak = max(peak, (await r.json())["in_flight"])
                    await asyncio.sleep(0.05)
                return peak, [t.result() for t in tasks]

        peak, results = asyncio.run(run())
        assert peak == 2  # both groups busy at once
        assert httpx.get(srv.url + "/get_loads").json()["per_dp_group_requests"] == [1, 1]
        ref1 = reference_log_probs(m1, ids)
        for status, body in results:
            assert status == 200 and abs(body["log_probs"][1] - float(ref1[1, ids[2]])) < 1e-4
        r = httpx.post(srv.url + "/update_weights_from_disk", json={"model_path": str(m2)}, timeout=120)
        assert r.status_code == 200 and r.json()["success"]
        ref2 = reference_log_probs(m2, ids)
        for _ in range(4):  # whichever group answers, it has the new weights
            out = httpx.post(srv.url + "/generate", json={"input_ids": ids, "sample_n": 2}, timeout=60).json()
            assert abs(out["log_probs"][1] - float(ref2[1, ids[2]])) < 1e-4
        assert min(httpx.get(srv.url + "/get_loads").json()["per_dp_group_requests"]) >= 1
    finally:
        srv.stop()


@pytest.mark.slow
def test_failed_warmup_never_opens_the_port(tmp_path):
    m1 = make_checkpoint(tmp_path / "m1", seed=1)
    srv = Server(tmp_path, [f"teacher.model_path={m1}", "teacher.tp=2", "teacher.warmup_timeout_s=0.0001"])
    try:
        code = srv.proc.wait(180)
        assert code != 0
        log = srv.read_log()
        assert "teacher warm-up failed" in log and "teacher server on" not in log
        with pytest.raises(httpx.ConnectError):
            httpx.get(srv.url + "/healthz", timeout=2)
    finally:
        srv.stop()
