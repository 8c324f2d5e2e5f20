"""reward=remote against a real aiohttp reward server on loopback that fails, stalls and talks nonsense."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest
from aiohttp import web

from slimecli.config.groups.reward import RewardConfig
from slimecli.reward import assign_rewards, reward_metrics
from slimecli.reward.remote import RemoteReward, RemoteRewardError
from slimecli.rollout.sample import Sample
from tests.helpers import ROOT, free_port


class RewardServer:
    """Behaviour per request from metadata.mode; counts attempts and concurrent requests per sample."""

    def __init__(self):
        self.attempts: Counter[int] = Counter()
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        meta = body["metadata"]
        idx = meta["idx"]
        self.attempts[idx] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            mode = meta.get("mode", "ok")
            if mode == "flaky" and self.attempts[idx] <= meta.get("fail_times", 2):
                return web.json_response({"error": "overloaded"}, status=500)
            if mode == "down":
                return web.json_response({"error": "always down"}, status=503)
            if mode == "slow" or (mode == "slow_once" and self.attempts[idx] == 1):
                try:
                    await asyncio.wait_for(self.release.wait(), 20)
                except TimeoutError:
                    pass
            if mode == "garbage":
                return web.Response(text="<html>502 bad gateway</html>", content_type="text/html")
            if mode == "junk_json":
                return web.json_response("banana")
            if mode == "reject":
                return web.json_response({"error": "bad request"}, status=400)
            if mode == "queue":
                await asyncio.sleep(0.05)
            return web.json_response({"score": len(body["response"]) / 10, "label_seen": body["label"]})
        finally:
            self.in_flight -= 1


async def serve(server: RewardServer) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/reward", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}/reward"


def samples_with(modes: list[str], **extra) -> list[Sample]:
    return [Sample(index=i, group_index=i, prompt=[{"role": "user", "content": "q"}], response="r" * (i + 1),
                   label=f"L{i}", metadata={"idx": i, "mode": mode, **extra}) for i, mode in enumerate(modes)]


def run_against_server(modes: list[str], log_name: str = "test_remote", extra: dict | None = None, **cfg_fields):
    async def main():
        server = RewardServer()
        runner, url = await serve(server)
        try:
            cfg = RewardConfig(name="remote", url=url, key="score", backoff_s=0.01, **cfg_fields)
            samples = samples_with(modes, **(extra or {}))
            await assign_rewards(samples, cfg, logging.getLogger(log_name))
            return server, url, samples
        finally:
            server.release.set()
            await runner.cleanup()

    return asyncio.run(main())


def test_remote_reward_retries_failures_and_survives_garbage(caplog):
    modes = ["ok", "flaky", "down", "garbage", "junk_json", "reject", "slow_once", "slow"]
    with caplog.at_level(logging.INFO, logger="test_remote"):
        server, url, samples = run_against_server(modes, timeout_s=0.5, max_retries=2)
    by_mode = dict(zip(modes, samples, strict=True))

    assert by_mode["ok"].reward == {"score": 0.1, "label_seen": "L0"}
    assert server.bodies[0].keys() == {"prompt", "response", "label", "metadata"}
    assert server.bodies[0]["prompt"] == [{"role": "user", "content": "q"}]
    assert by_mode["flaky"].reward["score"] == 0.2 and server.attempts[1] == 3  # two 500s, then success
    assert by_mode["slow_once"].reward["score"] == 0.7 and server.attempts[6] == 2  # a timeout, then success
    assert by_mode["junk_json"].reward == "banana"  # valid JSON: stored raw, the normaliser marks it invalid

    for mode, attempts in [("down", 3), ("garbage", 3), ("slow", 3), ("reject", 1)]:
        sample = by_mode[mode]
        assert sample.reward is None and sample.metadata["reward_error"] == "RemoteRewardError", mode
        assert server.attempts[sample.index] == attempts, mode
        assert url in sample.metadata["reward_error_detail"]
    assert "after 3 attempts: HTTP 503" in by_mode["down"].metadata["reward_error_detail"]
    assert "reply is not JSON: '<html>502" in by_mode["garbage"].metadata["reward_error_detail"]
    assert "no reply within reward.timeout_s=0.5s" in by_mode["slow"].metadata["reward_error_detail"]
    assert "rejected the request (HTTP 400" in by_mode["reject"].metadata["reward_error_detail"]
    assert any("4 of 8 samples have no reward" in r.getMessage() for r in caplog.records)

    m = reward_metrics(samples, key="score")
    assert (m["reward/valid"], m["reward/invalid/reward_error"], m["reward/invalid/string"]) == (3, 4, 1)


def test_remote_concurrency_limit():
    server, _, samples = run_against_server(["queue"] * 12, concurrency=3)
    assert all(isinstance(s.reward, dict) for s in samples)
    assert 1 <= server.max_in_flight <= 3


def test_unreachable_server_names_the_url():
    async def main():
        url = f"http://127.0.0.1:{free_port()}/reward"
        async with RemoteReward(url, timeout_s=2, max_retries=1, backoff_s=0.01) as remote:
            with pytest.raises(RemoteRewardError, match=rf"reward server {url} failed after 2 attempts"):
                await remote(Sample(response="x"))

    asyncio.run(main())


def test_payload_survives_unserialisable_metadata():
    server, _, samples = run_against_server(["ok"], extra={"tags": {7}, "path": ROOT})
    assert samples[0].reward["score"] == 0.1
    assert server.bodies[0]["metadata"]["tags"] == "{7}" and server.bodies[0]["metadata"]["path"] == str(ROOT)


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    remote = RemoteReward("http://127.0.0.1:1/reward", backoff_s=0.5, backoff_max_s=3.0)
    for attempt, base in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 3.0), (10, 3.0)]:
        delays = {remote._delay(attempt) for _ in range(50)}
        assert all(0.5 * base <= d < 1.5 * base for d in delays)
        assert len(delays) > 1  # jittered
