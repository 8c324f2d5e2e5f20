"""trainer.weight_sync=disk|shared_memory|nccl against a real engine: the new weights serve, bad requests 4xx."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.engine.shm import SEGMENT_PREFIX, remove_stale_segments, segment_dir
from slimecli.engine.weight_transfer import SharedSegment, layout
from slimecli.model.tiny import create_tiny_model
from slimecli.rollout.client import EngineClient
from slimecli.train.weight_sync import make_weight_sync
from tests.helpers.engine import Engine, engine_fixture, hf_logprobs

SAMPLING = {"temperature": 0.8, "max_new_tokens": 8, "ignore_eos": True}
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from engine_fixture(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, Any]]:
    """Three tiny models of the engine's architecture with other weights, and their HF reference."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for seed in (1, 2, 3):
        path = create_tiny_model(root / f"seed{seed}", seed=seed)
        out[seed] = (path, AutoModelForCausalLM.from_pretrained(str(path)).eval())
    return out


class Coordinator:
    """What rank 0 gives a WeightSync: the engine clients and a way to run coroutines."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.engines = [EngineClient(url)]

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        for e in self.engines:
            self.run(e.close())
        self.loop.close()


def served_logprobs(url: str) -> tuple[list[int], list[float], str]:
    async def main() -> tuple[list[int], list[float], str]:
        async with EngineClient(url) as c:
            out = await c.generate(PROMPT, sampling_params=SAMPLING, return_logprob=True)
        return out["output_ids"], [e[0] for e in out["meta_info"]["output_token_logprobs"]], \
            out["meta_info"]["weight_version"]
    return asyncio.run(main())


@pytest.mark.parametrize("kind, seed", [("disk", 1), ("shared_memory", 2), ("nccl", 3)])
def test_each_kind_makes_the_engine_serve_the_new_weights(engine: Engine, models, tmp_path: Path,
                                                          kind: str, seed: int) -> None:
    path, hf = models[seed]
    cfg = load([f"model.path={engine.model_path}", f"trainer.weight_sync={kind}"])
    side = Coordinator(engine.url)
    sync = make_weight_sync(cfg, tmp_path, side.engines, side.run)
    try:
        state = dict(hf.state_dict())
        where = sync.push(state, 10 + seed)
        ids, lps, version = served_logprobs(engine.url)
        assert version == str(10 + seed)
        assert lps == pytest.approx(hf_logprobs(hf, PROMPT, ids, 0.8), abs=2e-4)
        if kind == "shared_memory":
            assert (segment_dir() / where).is_file()
            sync.push(state, 20 + seed)  # the same layout: the segment is reused
            assert (segment_dir() / where).is_file()
            assert served_logprobs(engine.url)[2] == str(20 + seed)
        if kind == "disk":
            assert Path(where).is_dir() and Path(where).parent == tmp_path / "weights"
    finally:
        sync.close()
        side.close()
    if kind == "shared_memory":
        assert not (segment_dir() / where).exists()  # close() gives the RAM back


def test_shared_memory_keeps_one_copy_for_trainer_and_engine(engine: Engine, models, tmp_path: Path) -> None:
    path, _ = models[2]
    policy = AutoModelForCausalLM.from_pretrained(str(path)).eval()  # rank 0's model, which the sync may move
    cfg = load([f"model.path={engine.model_path}", "trainer.weight_sync=shared_memory"])
    side = Coordinator(engine.url)
    sync = make_weight_sync(cfg, tmp_path, side.engines, side.run, policy=policy)
    try:
        sync.push(dict(policy.state_dict()), 41)
        base, size = sync.segment.address, sync.segment.size
        assert all(base <= p.data_ptr() < base + size for p in policy.parameters())  # the policy lives there now
        sync.before_update()
        assert engine.get("/get_server_info").json()["paused"] is True  # no engine step while the weights change
        with torch.no_grad():  # what the optimizer does: in place, while the engine is paused
            for p in policy.parameters():
                p.mul_(0.5)
        sync.push(dict(policy.state_dict()), 42)
        ids, lps, version = served_logprobs(engine.url)
        assert version == "42"
        assert lps == pytest.approx(hf_logprobs(policy, PROMPT, ids, 0.8), abs=2e-4)
    finally:
        sync.close()
        side.close()


def _post(engine: Engine, path: str, body: object) -> tuple[int, dict]:
    resp = engine.post(path, body)
    return resp.status_code, resp.json()


def test_shared_memory_requests_that_cannot_apply_are_4xx_and_keep_the_old_weights(engine: Engine) -> None:
    before = engine.generate(input_ids=PROMPT, sampling_params={**SAMPLING, "temperature": 0})
    model = AutoModelForCausalLM.from_pretrained(str(engine.model_path))
    tensors = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    slots, size = layout((k, t.dtype, list(t.shape)) for k, t in tensors.items())
    seg = SharedSegment(segment_dir() / f"{SEGMENT_PREFIX}{os.getpid()}-test", size, create=True)
    try:
        for slot in slots:
            seg.view(slot).copy_(torch.full_like(tensors[slot.name], 0.5))  # weights that would change the output
        manifest = [s.to_json() for s in slots]
        name = seg.path.name
        cases = {
            "segment: must be a name": {"segment": "../../etc/passwd", "tensors": manifest},
            "no shared-memory segment": {"segment": SEGMENT_PREFIX + "nosuch", "tensors": manifest},
            "lie beyond": {"segment": name, "tensors": [{**manifest[0], "offset": size}]},
            "not a tensor of the served model": {"segment": name, "tensors": [{**manifest[0], "name": "nope"}]},
            "in the served model, not": {"segment": name, "tensors": [{**manifest[0], "shape": [1]}]},
            "tensors[0].dtype": {"segment": name, "tensors": [{**manifest[0], "dtype": "complex128"}]},
            "tensors: must be a non-empty list": {"segment": name, "tensors": []},
            "extra: unknown key": {"segment": name, "tensors": manifest, "extra": 1},
        }
        for needle, body in cases.items():
            status, reply = _post(engine, "/update_weights_from_shared_memory", body)
            assert status == 400 and needle in reply["error"]["message"], (needle, reply)
        after = engine.generate(input_ids=PROMPT, sampling_params={**SAMPLING, "temperature": 0})
        assert after["output_ids"] == before["output_ids"]  # nothing of the bad requests was applied
    finally:
        seg.close(unlink=True)


def test_weight_group_requests_that_cannot_apply_are_4xx(engine: Engine) -> None:
    group = {"master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 1, "world_size": 2,
             "group_name": "g", "backend": "nccl"}
    cases = [
        ("/init_weights_update_group", group, "nccl needs an engine on a GPU"),
        ("/init_weights_update_group", {**group, "backend": "gloo", "rank_offset": 0}, "rank_offset"),
        ("/init_weights_update_group", {**group, "backend": "gloo", "world_size": 1}, "world_size"),
        ("/init_weights_update_group", {**group, "backend": "mpi"}, "backend: not an allowed value (got 'mpi')"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]],
                                              "group_name": "g"}, "no weight-update group"),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": [], "shapes": [[1]]}, "lengths differ"),
        ("/destroy_weights_update_group", {"group_name": "g"}, "no weight-update group"),
    ]
    for path, body, needle in cases:
        status, reply = _post(engine, path, body)
        assert status == 400 and needle in reply["error"]["message"], (path, body, reply)


def test_weight_bodies_are_decoded_with_errors_naming_each_field(engine: Engine) -> None:
    """Every weight endpoint's body goes through the one request decoder: each problem at once, by field."""
    def error(path: str, body: dict) -> str:
        status, reply = _post(engine, path, body)
        assert status == 400, reply
        return reply["error"]["message"]

    text = error("/init_weights_update_group", {"master_adress": "h", "master_port": "x", "rank_offset": 0,
                                                "world_size": 1, "backend": "ncl"})
    assert "master_adress: unknown key" in text and "did you mean 'master_address'?" in text
    assert "master_address: is required" in text and "master_port: expected int (got 'x')" in text
    assert "rank_offset: must be >= 1 (rank 0 is the trainer) (got 0)" in text
    assert "world_size: must be in [2, 65536]" in text and "did you mean 'nccl'?" in text
    group = {"master_address": "127.0.0.1", "master_port": 29999, "world_size": 2, "backend": "gloo"}
    assert "rank_offset: must be in 1..1" in error("/init_weights_update_group", {**group, "rank_offset": 2})
    text = error("/update_weights_from_distributed", {"names": ["a", ""], "dtypes": "float32", "shapes": [[-1]],
                                                      "weight_version": 1.5, "flush_cache": "yes"})
    assert "names[1]: must not be empty" in text and "dtypes: expected a list of str" in text
    assert "shapes[0][0]: must be in [0, " in text and "weight_version: expected str | int" in text
    assert "flush_cache: expected bool" in text
    assert "names: must be distinct ('a' twice)" in error("/update_weights_from_distributed", {
        "names": ["a", "a"], "dtypes": ["float32"] * 2, "shapes": [[1]] * 2, "group_name": "missing"})
    text = error("/update_weights_from_shared_memory", {"tensors": "all", "abort_all_requests": 1})
    assert "segment: is required" in text and "tensors: expected a list" in text
    assert "abort_all_requests: expected bool" in text
    assert "group_name: expected str (got 3)" in error("/destroy_weights_update_group", {"group_name": 3})
    assert "x: unknown key" in error("/end_weight_update", {"x": 1})
    assert "did you mean 'draft'?" in error("/begin_weight_update", {"selector": "drafts"})


def test_weight_update_session_opens_once_and_closes_once(engine: Engine) -> None:
    """SGLang's session (mid-2026 on): begin -> updates -> end, one at a time; both ends refuse out of turn."""
    status, reply = _post(engine, "/end_weight_update", {})
    assert status == 409 and reply["success"] is False and "no weight-update session" in reply["message"]
    assert _post(engine, "/begin_weight_update", {}) == (200, {"success": True, "message": "Success"})
    try:
        status, reply = _post(engine, "/begin_weight_update", {"selector": "all"})
        assert status == 409 and "already open" in reply["message"]
    finally:
        assert _post(engine, "/end_weight_update", {})[0] == 200
    status, reply = _post(engine, "/begin_weight_update", {"selector": "drafts"})
    assert status == 400 and "selector" in reply["error"]["message"]


class SessionlessClient(EngineClient):
    """A client of the SGLang API before sessions: it never opens one."""

    async def begin_weight_update(self) -> bool:
        return False


def test_update_outside_a_session_is_refused_and_rank_0_stops_waiting(engine: Engine, models, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine refuses before it joins the broadcast; rank 0 says so instead of blocking in its broadcast.
    (Inside a session the same push succeeds: test_each_kind_makes_the_engine_serve_the_new_weights, nccl.)"""
    from slimecli.train.weight_sync import group

    monkeypatch.setattr(group, "GROUP_NAME", "slimecli_weight_update_sessionless")  # this group is abandoned
    path, hf = models[1]
    cfg = load([f"model.path={engine.model_path}", "trainer.weight_sync=nccl", "rollout.request_timeout_s=30"])
    side = Coordinator(engine.url)
    side.engines = [SessionlessClient(engine.url)]
    sync = make_weight_sync(cfg, tmp_path, side.engines, side.run)
    before = engine.get("/get_model_info").json()["weight_version"]
    try:
        with pytest.raises(RuntimeError) as exc:
            sync.push(dict(hf.state_dict()), 77)
        message = str(exc.value)
        assert "requires an open weight-update session" in message and engine.url in message
        assert "abandoned" in message
        with pytest.raises(RuntimeError, match="unusable"):
            sync.push(dict(hf.state_dict()), 78)
    finally:
        sync.close()
        side.close()
    assert engine.get("/get_server_info").json()["paused"] is False  # continue_generation ran
    assert engine.get("/get_model_info").json()["weight_version"] == before


def test_client_finds_engines_without_sessions_by_their_404() -> None:
    from aiohttp import web

    calls: list[str] = []

    async def not_found(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"detail": "Not Found"}, status=404)

    async def main() -> tuple[bool, bool, bool | None]:
        app = web.Application()
        app.router.add_post("/begin_weight_update", not_found)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with EngineClient(f"http://127.0.0.1:{port}") as client:
                first, second = await client.begin_weight_update(), await client.begin_weight_update()
                return first, second, client.has_update_session
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == (False, False, False)
    assert calls == ["/begin_weight_update"]  # asked once; the answer is remembered


def test_segments_of_dead_trainers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    stale = segment_dir() / f"{SEGMENT_PREFIX}{dead.stdout.strip()}-old"
    live = segment_dir() / f"{SEGMENT_PREFIX}{os.getpid()}-live"
    stale.write_bytes(b"x" * 64)
    live.write_bytes(b"x" * 64)
    try:
        assert remove_stale_segments() >= 1
        assert not stale.exists() and live.exists()
    finally:
        stale.unlink(missing_ok=True)
        live.unlink(missing_ok=True)


def test_config_rules() -> None:
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.weight_sync=shared_memory", "rollout=sglang"])
    assert "trainer.weight_sync" in str(exc.value) and "rollout=sglang" in str(exc.value)
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.weight_sync=shared_memory", "rollout.host=10.0.0.7"])
    assert "on this host" in str(exc.value)
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.weight_sync=ncl"])
    assert "trainer.weight_sync" in str(exc.value) and "nccl" in str(exc.value)
    with pytest.raises(ConfigErrors) as exc:
        load(["trainer.weight_sync_bucket_mb=0"])
    assert "trainer.weight_sync_bucket_mb" in str(exc.value)
    assert load(["trainer.weight_sync=nccl", "rollout=sglang"]).trainer.weight_sync == "nccl"


@pytest.mark.slow
@pytest.mark.parametrize("kind, logged", [("shared_memory", "weights updated from shared memory"),
                                          ("nccl", "weights updated from group")])
def test_training_pushes_every_step_without_a_checkpoint_on_disk(tmp_path: Path, kind: str, logged: str) -> None:
    from tests.helpers.train_e2e import metrics, run_train

    run = tmp_path / "run"
    before = set(segment_dir().glob(f"{SEGMENT_PREFIX}*"))
    # with TIS the trainer compares its own log-probs with the engine's: equal weights give a ratio of 1
    out = run_train(run, f"trainer.weight_sync={kind}", "trainer.max_steps=3", "trainer.save_interval=0",
                    "trainer.off_policy_correction=tis", "trainer.nproc=1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    engine_log = (run / "logs" / "engine-0.log").read_text()
    versions = [line.rsplit("weight_version=", 1)[1].rstrip(")") for line in engine_log.splitlines() if logged in line]
    assert versions == ["1", "2", "3"], engine_log[-2000:]
    assert not (run / "weights").exists()  # nothing went through the disk
    rows = metrics(run)
    assert [row["weight_version"] for row in rows] == [1, 2, 3]
    for row in rows[1:]:  # generated with the weights pushed after the step before
        assert row["off_policy/is_weight_mean"] == pytest.approx(1.0, abs=1e-3), row
        assert row["off_policy/clipped_frac"] < 0.01 and row["off_policy/mismatch_kl"] < 1e-4, row
    assert set(segment_dir().glob(f"{SEGMENT_PREFIX}*")) <= before  # the trainer gave its segment back


def test_preflight_refuses_shared_memory_that_does_not_fit(monkeypatch: pytest.MonkeyPatch, models) -> None:
    import shutil
    from collections import namedtuple

    from slimecli.launch.preflight import weight_sync_errors

    path, _hf = models[1]
    cfg = load([f"model.path={path}", "trainer.weight_sync=shared_memory"])
    assert weight_sync_errors(cfg) == []
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(64 << 20, 64 << 20, 1 << 10))  # a full /dev/shm
    (err,) = weight_sync_errors(cfg)
    assert err.path == "trainer.weight_sync" and "MiB free" in err.reason and "--shm-size" in str(err.hint)
    assert weight_sync_errors(load([f"model.path={path}"])) == []  # disk needs no shared memory
