"""The teacher server over real HTTP: `slimecli teacher serve` with tp=2 under torchrun (gloo), every status code."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest

from tests.helpers.teacher import VOCAB, Server, make_checkpoint, reference_log_probs

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_LEN = 64


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("teacher_ckpt")
    return make_checkpoint(tmp / "m1", seed=1), make_checkpoint(tmp / "m2", seed=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory, ckpts):
    srv = Server(tmp_path_factory.mktemp("teacher_srv"),
                 [f"teacher.model_path={ckpts[0]}", "teacher.tp=2", f"teacher.api_key={KEY}",
                  f"teacher.max_length={MAX_LEN}", "teacher.log_interval_s=0.5"],
                 env={"SLIMECLI_TEACHER_TEST_HOOKS": "1"})
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def post(srv: Server, path: str, body, headers=AUTH) -> httpx.Response:
    kw = {"json": body} if not isinstance(body, str | bytes) else {"content": body}
    return httpx.post(srv.url + path, headers=headers, timeout=60, **kw)


def test_generate_matches_full_vocab_reference(server, ckpts):
    ids = [1, 5, 7, 9, 1000, 3]
    labels = [[5, 6, 1000], [7, 8, 0], [9, 1, 2], [1000, 4, 5], [3, 3, 999]]
    r = post(server, "/generate", {"input_ids": ids, "sample_n": 4, "label_token_ids": labels})
    assert r.status_code == 200, r.text
    out = r.json()
    ref = reference_log_probs(ckpts[0], ids)
    assert out["request_id"]
    assert len(out["log_probs"]) == len(ids) - 1
    for i, lp in enumerate(out["log_probs"]):
        assert abs(lp - float(ref[i, ids[i + 1]])) < 1e-4
    for i, row in enumerate(labels):
        for j, tok in enumerate(row):
            assert abs(out["label_token_log_probs"][i][j] - float(ref[i, tok])) < 1e-4
    assert [len(row) for row in out["sampled_token_ids"]] == [4] * (len(ids) - 1)
    for i, row in enumerate(out["sampled_token_ids"]):
        for j, tok in enumerate(row):
            assert 0 <= tok < VOCAB
            assert abs(out["sampled_log_probs"][i][j] - float(ref[i, tok])) < 1e-4
    plain = post(server, "/generate", {"input_ids": ids}).json()
    assert "sampled_token_ids" not in plain and "label_token_log_probs" not in plain
    hot = post(server, "/generate", {"input_ids": ids, "temperature": 0.5}).json()
    ref_hot = reference_log_probs(ckpts[0], ids, temperature=0.5)
    assert abs(hot["log_probs"][0] - float(ref_hot[0, ids[1]])) < 1e-4


BAD_BODIES = [
    ({}, "input_ids is required"),
    ({"input_ids": []}, "non-empty"),
    ({"input_ids": "1 2 3"}, "non-empty"),
    ({"input_ids": [1, 2.5]}, "input_ids[1]"),
    ({"input_ids": [1, True]}, "input_ids[1]"),
    ({"input_ids": [1, "2"]}, "input_ids[1]"),
    ({"input_ids": [1, VOCAB]}, "(token ids of the vocabulary)"),
    ({"input_ids": [-1, 2]}, "(token ids of the vocabulary)"),
    ({"input_ids": [1, 2], "sample_n": -1}, "sample_n"),
    ({"input_ids": [1, 2], "sample_n": True}, "sample_n"),
    ({"input_ids": [1, 2], "sample_n": 1.5}, "sample_n"),
    ({"input_ids": [1, 2, 3], "label_token_ids": [[1]]}, "len(input_ids)-1"),
    ({"input_ids": [1, 2, 3], "label_token_ids": [[1, 2], [3]]}, "equal width"),
    ({"input_ids": [1, 2, 3], "label_token_ids": [[1], ["x"]]}, "label_token_ids[1][0]"),
    ({"input_ids": [1, 2, 3], "label_token_ids": [[1], [1.0]]}, "label_token_ids[1][0]"),
    ({"input_ids": [1, 2, 3], "label_token_ids": [[1], 7]}, "label_token_ids[1]"),
    ({"input_ids": [1, 2, 3], "label_token_ids": [[1], [VOCAB]]}, "(token ids of the vocabulary)"),
    ({"input_ids": [1, 2, 3], "label_token_ids": "no"}, "label_token_ids"),
    ({"input_ids": [1, 2], "temperature": 0}, "temperature"),
    ([1, 2, 3], "JSON object"),
    ("{not json", "not valid JSON"),
]


@pytest.mark.parametrize("body,message", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_malformed_generate_is_400(server, body, message):
    r = post(server, "/generate", body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_too_long_is_413_with_lengths(server):
    r = post(server, "/generate", {"input_ids": [1] * (MAX_LEN + 1)})
    assert r.status_code == 413
    assert r.json()["input_length"] == MAX_LEN + 1 and r.json()["max_length"] == MAX_LEN
    assert post(server, "/generate", {"input_ids": [1] * MAX_LEN}).status_code == 200


def test_bearer_token(server):
    assert post(server, "/generate", {"input_ids": [1, 2]}, headers={}).status_code == 401
    assert post(server, "/generate", {"input_ids": [1, 2]}, headers={"Authorization": "Bearer no"}).status_code == 401
    assert httpx.get(server.url + "/info").status_code == 401
    assert httpx.get(server.url + "/healthz").json() == {"ok": True}  # the liveness probe stays open


def test_info_detect_loads(server, ckpts):
    info = httpx.get(server.url + "/info", headers=AUTH).json()
    assert info["vocab_size"] == VOCAB and info["tp"] == 2 and info["dp"] == 1
    assert info["config"]["teacher"]["api_key"] == "***"
    assert httpx.get(server.url + "/detect", headers=AUTH).json()["server_type"] == "slimecli_teacher"
    loads = httpx.get(server.url + "/get_loads", headers=AUTH).json()
    for key in ("queue_size", "in_flight", "finished_requests", "finished_tokens", "pending_tokens"):
        assert isinstance(loads[key], int)
    log = server.read_log()
    assert log.index("warm-up request ok") < log.index("teacher server on")
    assert "generate id=" in log


def test_update_bad_requests(server, ckpts, tmp_path):
    assert post(server, "/update_weights_from_disk", {}).status_code == 400
    assert post(server, "/update_weights_from_disk", {"model_path": 5}).status_code == 400
    assert post(server, "/update_weights_from_disk", {"model_path": str(ckpts[0].parent / "nope")}).status_code == 400
    outside = post(server, "/update_weights_from_disk", {"model_path": str(make_checkpoint(tmp_path / "m", seed=5))})
    assert outside.status_code == 403 and "outside the directories" in outside.json()["error"]  # teacher.weight_roots
    r = post(server, "/update_weights_from_disk", {"model_path": str(ckpts[0])})
    assert r.status_code == 200 and r.json()["skipped"] is True


async def _until(session, url, pred, timeout=60.0):
    for _ in range(int(timeout / 0.05)):
        async with session.get(url + "/get_loads", headers=AUTH) as r:
            loads = await r.json()
        if pred(loads):
            return loads
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition never held: {loads}")


def test_disconnect_cancels_queued_request(server):
    async def run():
        async with aiohttp.ClientSession() as s:
            before = await _until(s, server.url, lambda d: True)
            slow = asyncio.create_task(s.post(server.url + "/generate", headers=AUTH,
                                              json={"input_ids": [1, 2, 3], "test_delay_s": 3.0}))
            await _until(s, server.url, lambda d: d["in_flight"] == 1)
            with pytest.raises(asyncio.TimeoutError):
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as s2:
                    await s2.post(server.url + "/generate", headers=AUTH, json={"input_ids": [4, 5, 6]})
            loads = await _until(s, server.url, lambda d: d["cancelled_requests"] > before["cancelled_requests"])
            assert loads["queue_size"] == 0
            assert (await slow).status == 200
            after = await _until(s, server.url, lambda d: d["in_flight"] == 0)
            assert after["finished_requests"] == before["finished_requests"] + 1  # the cancelled one never ran
    asyncio.run(run())


def test_update_waits_coalesces_conflicts_and_rejects(server, ckpts):
    m1, m2 = str(ckpts[0]), str(ckpts[1])
    ids = [3, 1, 4, 1, 5]

    async def run():
        async with aiohttp.ClientSession() as s:
            async def call(path, body):
                async with s.post(server.url + path, json=body, headers=AUTH) as r:
                    return r.status, await r.json()

            busy = asyncio.create_task(call("/generate", {"input_ids": ids, "test_delay_s": 2.0}))
            await _until(s, server.url, lambda d: d["in_flight"] == 1)
            first = asyncio.create_task(call("/update_weights_from_disk", {"model_path": m2, "test_delay_s": 2.0}))
            await _until(s, server.url, lambda d: d["updating"])
            joined = asyncio.create_task(call("/update_weights_from_disk", {"model_path": m2}))
            conflict = await call("/update_weights_from_disk", {"model_path": m1})
            rejected = await call("/generate", {"input_ids": ids})
            return await busy, await first, await joined, conflict, rejected

    busy, first, joined, conflict, rejected = asyncio.run(run())
    assert busy[0] == 200  # the running request finished on the old weights before the load
    ref1, ref2 = reference_log_probs(ckpts[0], ids), reference_log_probs(ckpts[1], ids)
    assert abs(busy[1]["log_probs"][0] - float(ref1[0, ids[1]])) < 1e-4
    assert first == (200, {**first[1], "success": True, "coalesced": False})
    assert joined[0] == 200 and joined[1]["coalesced"] is True
    assert conflict[0] == 409
    assert rejected[0] == 503
    new = post(server, "/generate", {"input_ids": ids}).json()
    assert abs(new["log_probs"][0] - float(ref2[0, ids[1]])) < 1e-4
    assert httpx.get(server.url + "/info", headers=AUTH).json()["model_path"] == m2

    # Draining that takes longer than timeout_s: 503, nothing loaded.
    async def timeout_case():
        async with aiohttp.ClientSession() as s:
            busy = asyncio.create_task(s.post(server.url + "/generate", headers=AUTH,
                                              json={"input_ids": ids, "test_delay_s": 2.0}))
            await _until(s, server.url, lambda d: d["in_flight"] == 1)
            async with s.post(server.url + "/update_weights_from_disk", headers=AUTH,
                              json={"model_path": m1, "timeout_s": 0.2}) as r:
                status = r.status
            (await busy).release()
            return status

    assert asyncio.run(timeout_case()) == 503
    assert httpx.get(server.url + "/info", headers=AUTH).json()["model_path"] == m2
    r = post(server, "/update_weights_from_disk", {"model_path": m1})
    assert r.status_code == 200 and r.json()["success"]
    assert "load: queue=" in server.read_log()  # the periodic load line while busy


def test_client_scores_response_tokens(server, ckpts):
    from slimecli.config.groups.teacher import TeacherConfig
    from slimecli.rollout.sample import Sample
    from slimecli.teacher.client import TeacherClient, TeacherError

    cfg = TeacherConfig(name="server", url=server.url, api_key=KEY, concurrency=2, max_retries=1)
    samples = [Sample(tokens=[2, 7, 1, 8, 2, 8], response_length=3), Sample(tokens=[9, 9, 4], response_length=1),
               Sample(tokens=[5, 6], response_length=0)]

    async def run():
        async with TeacherClient(cfg) as client:
            for s, logps in zip(samples, await client.score(samples), strict=True):
                s.teacher_log_probs = logps
            with pytest.raises(TeacherError, match="400"):
                await client.score([Sample(tokens=[1, VOCAB + 5], response_length=1)])
            return await client.info()

    info = asyncio.run(run())
    assert info["temperature"] == 1.0
    for s in samples:
        assert len(s.teacher_log_probs) == s.response_length
        if s.response_length:
            ref = reference_log_probs(ckpts[0], s.tokens)
            n = len(s.tokens)
            expect = [float(ref[i - 1, s.tokens[i]]) for i in range(n - s.response_length, n)]
            assert max(abs(a - b) for a, b in zip(s.teacher_log_probs, expect, strict=True)) < 1e-4
