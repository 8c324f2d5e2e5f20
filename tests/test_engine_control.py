"""Engine control endpoints and the async client: abort, pause/continue, flush, weight updates, concurrency."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from transformers import AutoModelForCausalLM

from slimecli.config.compose import load
from slimecli.config.io import save_frozen
from slimecli.model.tiny import create_tiny_model
from slimecli.rollout.client import EngineClient, EngineError
from tests.helpers import ROOT, free_port, wait_until, wait_until_async
from tests.helpers.engine import Engine, engine_fixture, hf_logprobs, start_engine, stop_engine

LONG = {"temperature": 1.0, "max_new_tokens": 5000, "ignore_eos": True}
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from engine_fixture(tmp_path_factory.mktemp("engine"))


def run(coro):
    return asyncio.run(coro)


async def _states(c: EngineClient) -> dict:
    return (await c.get_server_info())["internal_states"][0]


async def _running(c: EngineClient, n: int = 1, timeout: float = 60) -> None:
    async def started() -> bool:
        return (await _states(c))["running"] >= n

    await wait_until_async(started, timeout, f"{n} request(s) to start running")


def test_abort_by_rid_and_all(engine: Engine) -> None:
    async def main() -> None:
        async with EngineClient(engine.url) as c:
            task = asyncio.create_task(c.generate([1, 2, 3], sampling_params=LONG, rid="long-1",
                                                  return_logprob=True))
            others = [asyncio.create_task(c.generate([4, 5], sampling_params=LONG)) for _ in range(2)]
            await _running(c, 3)
            await c.abort("long-1")
            out = await task
            fin = out["meta_info"]["finish_reason"]
            assert fin["type"] == "abort" and fin["message"]
            assert len(out["output_ids"]) < 5000
            assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
            assert not any(t.done() for t in others)
            await c.abort(all=True)
            for t in others:
                assert (await t)["meta_info"]["finish_reason"]["type"] == "abort"
            assert await c.health_generate()
    run(main())


def test_client_disconnect_aborts_its_request(engine: Engine) -> None:
    aborted = engine.get("/get_server_info").json()["internal_states"][0]["aborted_requests"]
    endless = {**LONG, "max_new_tokens": 60000}  # far more than the deadline below allows
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(engine.url + "/generate", json={"input_ids": [1, 2], "sampling_params": endless}, timeout=1.0)

    def aborted_and_idle() -> bool:
        states = engine.get("/get_server_info").json()["internal_states"][0]
        return states["running"] == 0 and states["waiting"] == 0 and states["aborted_requests"] == aborted + 1

    wait_until(aborted_and_idle, 60, "the abandoned request to be aborted", interval=0.1)


def test_pause_in_place_and_continue(engine: Engine) -> None:
    async def main() -> None:
        async with EngineClient(engine.url) as c:
            await c.pause(mode="in_place")
            task = asyncio.create_task(c.generate([9, 9], sampling_params=GREEDY))

            async def queued() -> bool:
                states = await _states(c)
                return states["waiting"] == 1 and states["running"] == 0

            await wait_until_async(queued, 60, "the request to wait in the paused engine's queue")
            assert not task.done()  # paused: queued, not served
            assert (await c.get_server_info())["paused"] is True
            await c.resume()
            out = await asyncio.wait_for(task, 60)
            assert out["meta_info"]["finish_reason"]["type"] == "length"
    run(main())


def test_pause_abort_and_retract(engine: Engine) -> None:
    hf = AutoModelForCausalLM.from_pretrained(str(engine.model_path)).eval()

    async def main() -> None:
        async with EngineClient(engine.url) as c:
            task = asyncio.create_task(c.generate([1, 2], sampling_params=LONG))
            await _running(c)
            await c.pause()  # default mode: abort
            assert (await task)["meta_info"]["finish_reason"]["type"] == "abort"
            await c.resume()
            sp = {"temperature": 1.0, "max_new_tokens": 400, "ignore_eos": True}
            task = asyncio.create_task(c.generate([3, 4], sampling_params=sp, return_logprob=True))
            await _running(c)
            await c.pause(mode="retract")
            await c.resume()
            out = await task
            assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
            # re-prefilled from its own tokens: every log-prob is still the model's at that position
            lps = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
            assert lps == pytest.approx(hf_logprobs(hf, [3, 4], out["output_ids"], 1.0), abs=2e-4)
    run(main())


def test_flush_cache(engine: Engine) -> None:
    async def main() -> None:
        async with EngineClient(engine.url) as c:
            assert await c.flush_cache()
            task = asyncio.create_task(c.generate([1], sampling_params=LONG))
            await _running(c)
            with pytest.raises(EngineError) as err:
                await c.flush_cache(timeout_s=0)
            assert err.value.status == 400
            await c.abort(all=True)
            await task
            assert await c.flush_cache()
    run(main())


def test_concurrent_requests_match_sequential(engine: Engine) -> None:
    prompts = [[(7 * i + j) % 4000 + 1 for j in range(1 + (i * 5) % 23)] for i in range(24)]

    async def main() -> None:
        async with EngineClient(engine.url) as c:
            sequential = [(await c.generate(p, sampling_params=GREEDY))["output_ids"] for p in prompts[:6]]

            async def one(i: int, p: list[int]) -> list[int]:
                await asyncio.sleep(0.01 * (i % 5))  # staggered: requests join a batch that is already running
                return (await c.generate(p, sampling_params=GREEDY))["output_ids"]

            together = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            assert together[:6] == sequential
            assert all(len(t) == 8 for t in together)
    run(main())


def test_update_weights_from_disk(engine: Engine, tmp_path: Path) -> None:
    new_model = create_tiny_model(tmp_path / "step1", seed=1)
    hf_new = AutoModelForCausalLM.from_pretrained(str(new_model)).eval()
    prompt = [5, 6, 7, 8]

    async def main() -> None:
        async with EngineClient(engine.url) as c:
            before = await c.generate(prompt, sampling_params=GREEDY)
            bad = await c.update_weights_from_disk(str(tmp_path / "missing"), weight_version="bad")
            assert bad["success"] is False and "missing" in bad["message"]
            same = await c.generate(prompt, sampling_params=GREEDY)
            assert same["output_ids"] == before["output_ids"] and same["meta_info"]["weight_version"] == "default"
            res = await c.sync_weights(str(new_model), weight_version=1)
            assert res["success"] is True, res
            assert (await c.get_model_info())["weight_version"] == "1"
            sp = {"temperature": 0.8, "max_new_tokens": 8, "ignore_eos": True}
            after = await c.generate(prompt, sampling_params=sp, return_logprob=True)
            assert after["meta_info"]["weight_version"] == "1"
            lps = [e[0] for e in after["meta_info"]["output_token_logprobs"]]
            assert lps == pytest.approx(hf_logprobs(hf_new, prompt, after["output_ids"], 0.8), abs=2e-4)
    run(main())


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_partial_rollout_goes_on_under_the_new_weights_from_where_it_was(engine: Engine, tmp_path: Path,
                                                                          mode: str) -> None:
    """trainer.partial_rollouts: a weight sync whose pause keeps the requests in flight; the request finishes under
    the new weights, its tokens split between the two versions (meta_info.weight_versions), and with retract its
    later log-probs are the new model's, recomputed over its own tokens."""
    from slimecli.rollout.sample import token_versions

    new_model = create_tiny_model(tmp_path / "v7", seed=7)
    hf_new = AutoModelForCausalLM.from_pretrained(str(new_model)).eval()
    sp = {"temperature": 1.0, "max_new_tokens": 200, "ignore_eos": True}

    async def main() -> None:
        async with EngineClient(engine.url, pause_mode=mode) as c:
            before = (await c.get_model_info())["weight_version"]
            task = asyncio.create_task(c.generate([3, 4], sampling_params=sp, return_logprob=True))
            await _running(c)
            res = await c.sync_weights(str(new_model), weight_version=7)
            assert res["success"] is True and res["num_paused_requests"] in (0, 1), res  # retract queues it
            out = await asyncio.wait_for(task, 120)
            assert out["meta_info"]["finish_reason"]["type"] == "length"  # not aborted
            spans = out["meta_info"]["weight_versions"]
            assert [x["version"] for x in spans] == [before, "7"], spans
            switch = spans[0]["end"]
            assert 0 < switch < 200 and spans[1] == {"version": "7", "start": switch, "end": 200}
            versions = token_versions(out["meta_info"], 200)
            assert versions[switch - 1] != 7 and versions[switch:] == [7] * (200 - switch)
            if mode == "retract":
                ids, lps = out["output_ids"], [e[0] for e in out["meta_info"]["output_token_logprobs"]]
                new = hf_logprobs(hf_new, [3, 4, *ids[:switch]], ids[switch:], 1.0)
                assert lps[switch:] == pytest.approx(new, abs=2e-4)
            await c.sync_weights(str(engine.model_path), weight_version=before)  # the next tests' weights
    run(main())


def test_engine_module_from_frozen_config(tmp_path: Path) -> None:
    """The supervisor's command: python -m slimecli.engine --config RUN/config.yaml --index i."""
    port = free_port()
    cfg = load([f"model.cache_dir={tmp_path / 'cache'}", f"rollout.port={port - 1}"])
    cfg_path = save_frozen(cfg, tmp_path / "run" / "config.yaml")
    argv = [sys.executable, "-m", "slimecli.engine", "--config", str(cfg_path), "--index", "1"]
    eng = start_engine(argv, port, tmp_path, tmp_path / "engine.log")
    try:
        async def main() -> None:
            async with EngineClient(eng.url) as c:
                await c.wait_ready(timeout_s=30)
                info = await c.get_model_info()
                assert Path(info["model_path"]).parent == tmp_path / "cache"
                out = await c.generate(text="hi", sampling_params={"max_new_tokens": 2})
                assert out["meta_info"]["completion_tokens"] <= 2
        run(main())
    finally:
        stop_engine(eng)
    assert eng.proc.returncode == 0, eng.log.read_text()


def test_start_failures_exit_non_zero_with_a_reason(engine: Engine, tmp_path: Path) -> None:
    port = int(engine.url.rsplit(":", 1)[1])
    argv = [sys.executable, "-m", "slimecli", "rollout", "serve", f"model.path={engine.model_path}",
            f"rollout.port={port}", f"run.root={tmp_path / 'runs'}"]
    busy = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)  # refused by pre-flight
    assert busy.returncode == 2 and f"rollout.port: 127.0.0.1:{port} is in use" in busy.stderr, busy.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "qwen3"}')
    argv[5] = f"model.path={broken}"
    argv[6] = f"rollout.port={free_port()}"
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "model.path: no weights in the checkpoint directory" in bad.stderr, bad.stderr
    (broken / "model.safetensors").write_bytes(b"not safetensors")  # passes pre-flight, fails to load
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((engine.model_path / name).read_bytes())
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 1 and "cannot load the model" in bad.stderr, bad.stderr


# What answers while the model loads and after the scheduler stopped: what the engine is, its load, and the
# clean-up of a weight-update group. Every other route needs the model.
OPEN_WHILE_NOT_READY = {"/get_model_info", "/model_info", "/get_server_info", "/server_info", "/get_load",
                        "/v1/loads", "/destroy_weights_update_group"}


def test_routes_that_need_the_model_answer_503_before_it_loads_and_after_the_scheduler_stops(tiny: Path) -> None:
    """Readiness route by route, over every route the app has (a new route is covered by default): each one that
    needs the model answers 503 with the same body, whatever its method and body; the probes of what the engine
    is stay open; an unknown path is still a 404 and a wrong api key still a 401."""
    from aiohttp import web

    from slimecli.engine.server import EngineServer
    from slimecli.engine.settings import EngineSettings

    async def main() -> None:
        server = EngineServer(EngineSettings(str(tiny), port=0, api_key="k"))
        server.loop = asyncio.get_running_loop()
        app = server.app()
        routes = sorted({(r.method, r.resource.canonical) for r in app.router.routes()
                         if r.method != "HEAD" and r.resource is not None})
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer k"},
                                     timeout=60) as c:
            async def check(reason: str) -> None:
                for method, path in routes:
                    resp = await c.request(method, path, json={} if method == "POST" else None)
                    if path in OPEN_WHILE_NOT_READY:
                        assert resp.status_code in (200, 400), (method, path, resp.text)
                    else:
                        assert (resp.status_code, resp.json()) == (503, {"error": {"message": reason}}), (method, path)

            try:
                assert {p for _, p in routes} > OPEN_WHILE_NOT_READY | {"/generate", "/health"}
                await check("the engine is starting")
                assert (await c.get("/no_such_route")).status_code == 404
                assert (await c.post("/generate", json={}, headers={"Authorization": "Bearer x"})).status_code == 401
                await asyncio.to_thread(server.load)
                server.ready = True
                assert (await c.get("/health")).status_code == 200
                assert (await c.post("/flush_cache")).json()["success"] is True
                assert server.scheduler is not None
                server.scheduler.stop()
                await check("the scheduler has stopped")
            finally:
                if server.scheduler is not None:
                    server.scheduler.stop()
                await runner.cleanup()

    run(main())
