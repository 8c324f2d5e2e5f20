"""Engine control endpoints: rollout.api_key (SGLang's --api-key), weight roots, /v1/loads — on a real engine.

With a key every endpoint but /health* answers 401 JSON without it; the trainer's weight sync (through rank 0's
coordinator), the engine client, the agents' engine link and the SGLang-teacher client all send it.
update_weights_from_disk loads only under rollout.weight_roots (symlinks resolved): outside is a 403 naming the
path, a path that is not one (`~nosuchuser/x`, a 5000-character name) a 400.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from slimecli.config.compose import load
from slimecli.model.tiny import create_tiny_model
from slimecli.net.auth import API_KEY_ENV, engine_api_key
from slimecli.rollout.client import EngineClient, EngineError
from tests.helpers.engine import Engine, engine_fixture

KEY = "k-3f9a"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = [5, 6, 7, 8]
SP = {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from engine_fixture(tmp_path_factory.mktemp("engine"), f"rollout.api_key={KEY}")


@pytest.fixture(scope="module")
def outside() -> Iterator[Path]:
    """A checkpoint outside the engine's weight roots (the pytest base directory)."""
    with tempfile.TemporaryDirectory(prefix="slimecli-outside-") as d:
        yield create_tiny_model(Path(d) / "ckpt", seed=3)


def _get(engine: Engine, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.get(engine.url + path, headers=headers, timeout=60)


def _post(engine: Engine, path: str, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(engine.url + path, json=body, headers=headers, timeout=120)


PROTECTED = [("POST", "/generate", {"input_ids": PROMPT, "sampling_params": SP}), ("GET", "/get_model_info", None),
             ("GET", "/get_server_info", None), ("GET", "/v1/loads", None), ("POST", "/flush_cache", {}),
             ("POST", "/abort_request", {"abort_all": True}), ("POST", "/pause_generation", {}),
             ("POST", "/continue_generation", {}), ("POST", "/update_weights_from_disk", {"model_path": "/x"}),
             ("POST", "/update_weights_from_shared_memory", {}), ("GET", "/no_such_path", None)]


@pytest.mark.parametrize("method, path, body", PROTECTED)
def test_without_the_key_every_endpoint_is_401_json(engine: Engine, method: str, path: str, body: object) -> None:
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"x-api-key": "nope"},
                    {"Authorization": "Basic " + KEY}):
        r = httpx.request(method, engine.url + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (path, headers, r.text)
        assert "Unauthorized" in r.json()["error"]["message"] and KEY not in r.text
        assert r.headers["WWW-Authenticate"] == "Bearer"


def test_health_stays_open_like_sglang_and_the_key_opens_the_rest(engine: Engine) -> None:
    assert _get(engine, "/health").status_code == 200
    assert _get(engine, "/health_generate").status_code == 200
    r = _post(engine, "/generate", {"input_ids": PROMPT, "sampling_params": SP}, AUTH)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3
    for headers in ({"Authorization": f"bearer {KEY}"}, {"x-api-key": KEY}):  # SGLang accepts both
        assert _get(engine, "/get_model_info", headers).status_code == 200
    assert _get(engine, "/no_such_path", AUTH).status_code == 404


def test_engine_client_and_engine_link_send_the_key(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from slimecli.agent.api.engine_link import EngineLink, EnginePool

    async def main() -> None:
        async with EngineClient(engine.url) as anonymous:
            with pytest.raises(EngineError) as info:
                await anonymous.generate(PROMPT, sampling_params=SP)
            assert info.value.status == 401
        async with EngineClient(engine.url, api_key=KEY) as c:
            assert len((await c.generate(PROMPT, sampling_params=SP))["output_ids"]) == 3
            chunks = [x async for x in c.generate_stream(PROMPT, sampling_params=SP)]
            assert chunks and len(chunks[-1]["output_ids"]) == 3
            assert (await c.get_loads())["loads"][0]["dp_rank"] == 0
        link = EngineLink(engine.url, api_key=KEY)
        pool = EnginePool([engine.url], api_key=KEY)
        try:
            assert (await link.generate(PROMPT, SP)).output_ids
            assert (await pool.generate(PROMPT, SP, session="s")).output_ids
            assert await link.healthy()
        finally:
            await link.close()
            await pool.close()
        monkeypatch.setenv(API_KEY_ENV, KEY)  # the key from the environment, as the launched processes get it
        async with EngineClient(engine.url) as from_env:
            assert len((await from_env.generate(PROMPT, sampling_params=SP))["output_ids"]) == 3

    asyncio.run(main())


def test_trainer_weight_sync_sends_the_key_end_to_end(engine: Engine, tmp_path: Path) -> None:
    """Rank 0's coordinator builds its engine clients from the config; the disk sync then pauses, flushes,
    loads and continues the engine with them."""
    from transformers import AutoModelForCausalLM

    from slimecli.model.loading import load_tokenizer
    from slimecli.train.coordinator import RolloutCoordinator
    from slimecli.train.weight_sync import make_weight_sync

    port = int(engine.url.rsplit(":", 1)[1])
    cfg = load([f"model.path={engine.model_path}", f"rollout.port={port}", f"rollout.api_key={KEY}",
                "trainer.weight_sync=disk"])
    coord = RolloutCoordinator(cfg, tmp_path, load_tokenizer(str(engine.model_path)))
    sync = make_weight_sync(cfg, tmp_path, coord.engines, coord.loop.run)
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(engine.model_path))
        where = sync.push(dict(hf.state_dict()), 7)
        assert Path(where).is_dir()
        assert _get(engine, "/get_model_info", AUTH).json()["weight_version"] == "7"
    finally:
        sync.close()
        coord.close()


def test_sglang_teacher_client_sends_its_key_to_an_engine(engine: Engine) -> None:
    from slimecli.teacher.client import TeacherClient, TeacherError

    cfg = load(["teacher=sglang", f"teacher.url={engine.url}", f"teacher.api_key={KEY}"]).teacher

    async def main() -> None:
        async with TeacherClient(cfg) as t:
            logps = await t.score_tokens([5, 6, 7, 8, 9], 2)
            assert len(logps) == 2 and all(x <= 0 for x in logps)
        no_key = load(["teacher=sglang", f"teacher.url={engine.url}"]).teacher
        async with TeacherClient(no_key) as t:
            with pytest.raises(TeacherError, match="401"):
                await t.score_tokens([5, 6, 7, 8, 9], 2)

    asyncio.run(main())


# ---- weight roots ------------------------------------------------------------------------------------------


def test_update_weights_only_from_under_the_roots(engine: Engine, outside: Path, tmp_path: Path) -> None:
    assert _post(engine, "/pause_generation", {}, AUTH).status_code == 200  # as an RL client does first
    r = _post(engine, "/update_weights_from_disk", {"model_path": str(outside)}, AUTH)
    assert r.status_code == 403, r.text
    message = r.json()["error"]["message"]
    assert str(outside.resolve()) in message and "rollout.weight_roots=[" in message  # how to allow it
    assert "generation continues" in message and _get(engine, "/get_server_info", AUTH).json()["paused"] is False
    link = tmp_path / "looks-inside"
    link.symlink_to(outside, target_is_directory=True)
    r = _post(engine, "/update_weights_from_disk", {"model_path": str(link)}, AUTH)
    assert r.status_code == 403 and str(outside.resolve()) in r.json()["error"]["message"]  # symlinks resolved
    dotdot = f"{tmp_path}/{os.path.relpath(outside, tmp_path)}"  # .. out of the roots
    assert _post(engine, "/update_weights_from_disk", {"model_path": str(dotdot)}, AUTH).status_code == 403
    inside = create_tiny_model(tmp_path / "step1", seed=1)
    r = _post(engine, "/update_weights_from_disk", {"model_path": str(inside), "weight_version": "in"}, AUTH)
    assert r.status_code == 200 and r.json()["success"] is True, r.text


@pytest.mark.parametrize("path, words", [
    ("~nosuchuser-slimecli/x", "no user"), ("/tmp/" + "a" * 5000, "longer"), ("/tmp/" + "b" * 300, "name"),
    ("/tmp/x\x00y", "NUL"), ("", "required"), ("\ud800/x", "surrogate")])
def test_paths_that_are_no_paths_are_400(engine: Engine, path: str, words: str) -> None:
    raw = json.dumps({"model_path": path})  # ASCII escapes: a NUL and a lone surrogate travel as \\u0000, \\ud800
    r = httpx.post(engine.url + "/update_weights_from_disk", content=raw, headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_the_default_root_is_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slimecli.engine.__main__ import weight_roots

    monkeypatch.delenv("SLIMECLI_RUN_DIR", raising=False)
    assert weight_roots(load([]), tmp_path / "run") == [tmp_path / "run"]
    assert weight_roots(load([]), None) == []  # no run directory: every path is refused (403)
    assert weight_roots(load([f"rollout.weight_roots=[{tmp_path}/a,{tmp_path}/b]"]), None) == [
        f"{tmp_path}/a", f"{tmp_path}/b"]
    monkeypatch.setenv("SLIMECLI_RUN_DIR", str(tmp_path / "launched"))
    assert weight_roots(load([]), tmp_path / "run") == [str(tmp_path / "launched")]


def test_key_resolution_and_the_sglang_launch_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slimecli.launch.plan import build_plan

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert engine_api_key(load([]).rollout.api_key) is None
    assert engine_api_key(load(["rollout.api_key=abc"]).rollout.api_key) == "abc"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert engine_api_key(load([]).rollout.api_key) == "from-env"
    assert engine_api_key(load(["rollout.api_key=abc"]).rollout.api_key) == "abc"
    model = create_tiny_model(tmp_path / "m", seed=0)
    cfg = load(["rollout=sglang", "rollout.api_key=abc", f"model.path={model}", "rollout.port=30000"])
    (spec, *_) = build_plan(cfg, tmp_path)
    i = spec.argv.index("--api-key")
    assert spec.argv[i + 1] == "abc" and "sglang.launch_server" in spec.argv
    assert spec.shown_argv()[i + 1] == "***" and "abc" not in str(spec.to_json())  # plan output, plan.json
    monkeypatch.delenv(API_KEY_ENV)
    (spec, *_) = build_plan(load(["rollout=sglang", f"model.path={model}", "rollout.port=30000"]), tmp_path)
    assert "--api-key" not in spec.argv


# ---- /v1/loads ---------------------------------------------------------------------------------------------

CORE = {"num_running_reqs": int, "num_waiting_reqs": int, "num_used_tokens": int, "num_total_tokens": int,
        "max_total_num_tokens": int, "token_usage": float, "gen_throughput": float, "cache_hit_rate": float,
        "utilization": float, "max_running_requests": int}


def test_v1_loads_has_sglangs_shape(engine: Engine) -> None:
    body = _get(engine, "/v1/loads", AUTH).json()
    assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert isinstance(body["timestamp"], str) and "T" in body["timestamp"]
    assert isinstance(body["num_accelerators"], int)
    (load_,) = body["loads"]
    assert load_["dp_rank"] == 0 and isinstance(load_["timestamp"], float)
    for key, kind in CORE.items():
        assert isinstance(load_[key], kind), key
    assert load_["max_running_requests"] >= 1 and 0.0 <= load_["token_usage"] <= 1.0
    assert set(load_["queues"]) == {"waiting", "grammar", "paused", "retracted"}
    only = _get(engine, "/v1/loads?include=queues", AUTH).json()["loads"][0]
    assert "queues" in only and "num_running_reqs" not in only
    core = _get(engine, "/v1/loads?include=core&dp_rank=0", AUTH).json()["loads"][0]
    assert "num_running_reqs" in core and "queues" not in core
    for bad in ("include=nope", "dp_rank=1", "format=xml"):
        r = _get(engine, f"/v1/loads?{bad}", AUTH)
        assert r.status_code == 400 and r.json()["error"]["message"].split(":")[0] in bad
    prom = _get(engine, "/v1/loads?format=prometheus", AUTH)
    assert prom.status_code == 200 and 'sglang_num_running_reqs{dp_rank="0"} ' in prom.text


def test_v1_loads_counts_a_running_request(engine: Engine) -> None:
    async def main() -> None:
        async with EngineClient(engine.url, api_key=KEY) as c:
            task = asyncio.create_task(c.generate(PROMPT, sampling_params={"max_new_tokens": 2000,
                                                                           "ignore_eos": True}, rid="long"))
            for _ in range(600):
                load_ = (await c.get_loads())["loads"][0]
                if load_["num_running_reqs"] >= 1:
                    break
                await asyncio.sleep(0.05)
            assert load_["num_running_reqs"] == 1 and load_["num_used_tokens"] >= len(PROMPT)
            await c.abort("long")
            out = await task
            assert out["meta_info"]["finish_reason"]["type"] == "abort"

    asyncio.run(main())
    assert os.environ.get(API_KEY_ENV) is None
