"""The control routes' bodies (slimecli/engine/bodies.py): one typed dataclass per route, SGLang's io_struct.

- each route accepts exactly the fields of SGLang's request struct, with SGLang's defaults, as recorded from
  sglang 0.5.23 in tests/data/sglang_control_structs.json (tests/test_sglang_contract.py holds that copy to
  SGLang's own classes); the fields it accepts and ignores are fields of both, each with its reason;
- good bodies decode; bad ones are a 400 naming every bad field, an unknown one with a did-you-mean;
- over HTTP on the shared engine: the 400s, SGLang-shaped bodies with every ignored field set answer as the
  bare body does, update_weight_version aborts by default as SGLang's does, /flush_cache?timeout= waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.engine import bodies
from slimecli.engine.bodies import PAUSE_MODES, ROUTES, PauseGenerationReq
from slimecli.engine.control import flush_query
from slimecli.engine.protocol import BadRequest, parse_body
from slimecli.rollout.client import EngineClient
from tests.helpers import wait_until_async
from tests.helpers.engine import Engine

SGLANG = json.loads((Path(__file__).parent / "data" / "sglang_control_structs.json").read_text())
STRUCTS: dict[str, dict[str, Any]] = SGLANG["structs"]
SGLANG_ROUTES = {path: route for path, route in ROUTES.items() if route.sglang is not None}


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("path", sorted(SGLANG_ROUTES))
def test_each_route_takes_sglangs_fields_with_sglangs_defaults(path: str) -> None:
    route = SGLANG_ROUTES[path]
    assert route.body is not None
    struct, ours = STRUCTS[route.sglang], _fields(route.body)
    assert set(ours) == set(struct["required"]) | set(struct["defaults"])
    required = {name for name, f in ours.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert required == set(struct["required"])
    assert {name: ours[name].default for name in struct["defaults"]} == struct["defaults"]


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_the_ignored_fields_are_fields_of_both_with_a_reason(path: str) -> None:
    route = ROUTES[path]
    if route.body is None or route.sglang is None:
        assert not route.ignored  # a body-less GET, or slimecli's own route: nothing is ignored
        return
    struct = STRUCTS[route.sglang]
    assert set(route.ignored) <= set(_fields(route.body)) & (set(struct["required"]) | set(struct["defaults"]))
    assert all(reason.strip() for reason in route.ignored.values())


def test_every_recorded_sglang_struct_has_its_route() -> None:
    assert set(STRUCTS) == {route.sglang for route in SGLANG_ROUTES.values()}
    assert SGLANG["sglang"] == "0.5.23"


def test_pause_modes_are_one_type() -> None:
    """#40's pause modes: the body's type, the scheduler's and trainer.pause_mode's choices are one Literal."""
    assert PAUSE_MODES == ("abort", "retract", "in_place")
    assert typing.get_type_hints(PauseGenerationReq)["mode"] == bodies.PauseMode
    assert set(typing.get_args(typing.get_type_hints(TrainerConfig)["pause_mode"])) <= set(PAUSE_MODES)
    from slimecli.engine.scheduler import Scheduler

    assert typing.get_type_hints(Scheduler.pause, vars(bodies))["mode"] == bodies.PauseMode


GOOD = [
    ("/abort_request", {"rid": "r1"}),
    ("/abort_request", {"abort_all": True, "rid": None}),
    ("/abort_request", {"rid": "r1", "abort_all": False, "finished_reason": {"type": "abort", "message": "x"},
                        "abort_message": "m", "weight_versions": [], "http_worker_ipc": "ipc:///w"}),
    ("/pause_generation", {}),
    *[("/pause_generation", {"mode": mode, "rid": "p"}) for mode in PAUSE_MODES],
    ("/continue_generation", {"torch_empty_cache": False}),
    ("/update_weights_from_disk", {"model_path": "/ckpt", "load_format": "safetensors", "abort_all_requests": True,
                                   "weight_version": 3, "is_async": True, "torch_empty_cache": True,
                                   "keep_pause": True, "recapture_cuda_graph": True, "token_step": 7,
                                   "flush_cache": False, "manifest": {"tensors": []}}),
    ("/update_weight_version", {"new_version": "v2", "abort_all_requests": False}),
    ("/load_lora_adapter", {"lora_name": "a", "lora_path": "/ad", "pinned": True, "lora_id": "1"}),
    ("/unload_lora_adapter", {"lora_name": "a", "lora_id": "1"}),
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                                    "world_size": 2, "group_name": "g", "backend": "gloo"}),
    ("/update_weights_from_distributed", {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2, 3]],
                                         "group_name": "g", "flush_cache": False, "abort_all_requests": False,
                                         "weight_version": "2", "load_format": None, "selector": "target",
                                         "torch_empty_cache": True}),
    ("/destroy_weights_update_group", {"group_name": "g"}),
    ("/begin_weight_update", {"selector": "all"}),
    ("/end_weight_update", {"rid": "e"}),
]


@pytest.mark.parametrize(("path", "body"), GOOD, ids=[f"{p}-{i}" for i, (p, _) in enumerate(GOOD)])
def test_good_bodies_decode(path: str, body: dict[str, Any]) -> None:
    route = ROUTES[path]
    assert route.body is not None
    out = parse_body(route.body, body)
    for key, value in body.items():
        if value is not None:
            assert getattr(out, key) == value


BAD = [
    ("/abort_request", {"rid": 5}, ["rid: expected str (got 5)"]),
    ("/abort_request", {"abort_all": "yes"}, ["abort_all: expected bool"]),
    ("/abort_request", {"abort_al": True}, ["abort_al: unknown key", "did you mean 'abort_all'?"]),
    ("/pause_generation", {"mode": "sideways"}, ["mode: not an allowed value (got 'sideways')",
                                                  "abort", "retract", "in_place"]),
    ("/pause_generation", {"mode": "inplace"}, ["mode: not an allowed value", "in_place"]),
    ("/pause_generation", {"mode": 1}, ["mode: "]),
    ("/continue_generation", {"torch_empty_cache": "no"}, ["torch_empty_cache: expected bool"]),
    ("/update_weights_from_disk", {}, ["model_path: is required"]),
    ("/update_weights_from_disk", {"model_path": 3, "flush_cache": "no", "token_step": -1, "weight_version": 1.5},
     ["model_path: expected str (got 3)", "flush_cache: expected bool", "token_step: must be >= 0",
      "weight_version: expected str | int"]),
    ("/update_weights_from_disk", {"model_path": "/x", "load_format": "dummy"}, ["load_format: not an allowed value"]),
    ("/update_weights_from_disk", {"model_path": "/x", "keep_paused": True},
     ["keep_paused: unknown key", "did you mean 'keep_pause'?"]),
    ("/update_weight_version", {"new_version": ""}, ["new_version: ", "(got '')"]),
    ("/update_weight_version", {"abort_all_requests": 1}, ["new_version: is required", "abort_all_requests: expected"]),
    ("/load_lora_adapter", {"lora_name": "a"}, ["lora_path: is required"]),
    ("/load_lora_adapter", {"lora_name": "a", "lora_path": "/p", "pinned": "yes"}, ["pinned: expected bool"]),
    ("/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]], "selector": "drafts"},
     ["selector: not an allowed value", "draft"]),
    ("/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]], "load_format": 5},
     ["load_format: expected"]),
    ("/begin_weight_update", {"selector": "everything"}, ["selector: not an allowed value"]),
    ("/end_weight_update", {"selector": "all"}, ["selector: unknown key"]),
]


@pytest.mark.parametrize(("path", "body", "says"), BAD, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(BAD)])
def test_bad_bodies_name_every_field(path: str, body: dict[str, Any], says: list[str]) -> None:
    route = ROUTES[path]
    assert route.body is not None
    with pytest.raises(BadRequest) as err:
        parse_body(route.body, body)
    for text in says:
        assert text in str(err.value)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False),
                  st.text(max_size=6), st.sampled_from([*PAUSE_MODES, "draft", "flattened_bucket", "auto"]))
_json = st.recursive(_leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c,
                                                                                       max_size=3)), max_leaves=6)
_names = sorted({f.name for r in ROUTES.values() if r.body is not None for f in dataclasses.fields(r.body)})


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(sorted(p for p, r in ROUTES.items() if r.body is not None)),
       body=st.dictionaries(st.one_of(st.sampled_from(_names), st.text(max_size=5)), _json, max_size=6))
def test_any_body_decodes_or_is_a_bad_request(path: str, body: dict[str, Any]) -> None:
    """What a handler sees: its dataclass, or BadRequest (a 400) -- never another exception (a 500)."""
    route = ROUTES[path]
    assert route.body is not None
    try:
        out = parse_body(route.body, body)
    except BadRequest as exc:
        assert str(exc)
    else:
        assert isinstance(out, route.body)


def test_flush_cache_timeout_query() -> None:
    assert flush_query([]).timeout == 0 and flush_query(["2.5"]).timeout == 2.5
    for values, says in ((["-1"], "timeout: must be >= 0"), (["soon"], "timeout: expected a number"),
                         (["nan"], "timeout: expected a number"), (["inf"], "timeout: expected a number"),
                         (["1", "2"], "timeout: given more than once")):
        with pytest.raises(BadRequest, match=says):
            flush_query(values)


# ---- over HTTP, on the shared engine (each test puts back what it changes) ----------------------------------
HTTP_BAD = [(path, body, says[0]) for path, body, says in BAD if path != "/init_weights_update_group"] + [
    ("/begin_weight_update", {"selector": "draft"}, "selector: 'draft' names a draft model"),
    ("/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]],
                                          "load_format": "flattened_bucket"}, "load_format: flattened_bucket"),
    ("/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]],
                                          "selector": "draft"}, "selector: 'draft'"),
]


def test_bad_control_bodies_are_400_naming_the_field_over_http(engine: Engine) -> None:
    for path, body, says in HTTP_BAD:
        resp = engine.post(path, body)
        assert resp.status_code == 400, (path, body, resp.text)
        assert says in resp.json()["error"]["message"], (path, resp.text)
    resp = httpx.post(engine.url + "/flush_cache?timeout=-1", timeout=30)
    assert resp.status_code == 400 and "timeout: must be >= 0" in resp.json()["error"]["message"]
    assert engine.get("/get_server_info").json()["paused"] is False  # a refused disk update lifted no pause wrongly
    assert engine.get("/health_generate").status_code == 200


SAMPLES: dict[str, Any] = {"rid": "trace-1", "http_worker_ipc": "ipc:///tmp/worker-1",
                           "finished_reason": {"type": "abort"}, "abort_message": "m", "weight_versions": [],
                           "load_format": "auto", "is_async": True, "keep_pause": True, "recapture_cuda_graph": True,
                           "token_step": 7, "manifest": {}, "pinned": True, "lora_id": "id-1"}


def _with_ignored(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body with every field the route ignores set, to a value other than SGLang's default."""
    route, out = ROUTES[path], dict(body)
    assert route.sglang is not None
    defaults = STRUCTS[route.sglang]["defaults"]
    for name in route.ignored:
        default = defaults.get(name)
        out[name] = (not default) if isinstance(default, bool) else SAMPLES[name]
    return out


def test_every_ignored_field_is_accepted_and_changes_nothing(engine: Engine) -> None:
    version = engine.get("/get_model_info").json()["weight_version"]
    calls = [("/abort_request", {"rid": "no-such-request"}), ("/pause_generation", {"mode": "in_place"}),
             ("/continue_generation", {}),
             ("/update_weights_from_disk", {"model_path": str(engine.model_path), "weight_version": version}),
             ("/update_weight_version", {"new_version": version, "abort_all_requests": False}),
             ("/load_lora_adapter", {"lora_name": "a", "lora_path": str(engine.model_path / "missing")}),
             ("/unload_lora_adapter", {"lora_name": "never-loaded"}),
             ("/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]],
                                                   "group_name": "none"}),
             ("/destroy_weights_update_group", {"group_name": "none"}),
             ("/begin_weight_update", {}), ("/end_weight_update", {})]
    assert {path for path, _ in calls} | {"/init_weights_update_group"} == set(SGLANG_ROUTES)
    bare = [engine.post(path, body) for path, body in calls]  # in order: pause then continue, begin then end
    full = [engine.post(path, _with_ignored(path, body)) for path, body in calls]
    for (path, _), b, f in zip(calls, bare, full, strict=True):
        assert f.status_code == b.status_code, (path, b.text, f.text)
        assert f.json().get("success") == b.json().get("success"), (path, f.text)
    info = engine.get("/get_server_info").json()
    assert info["paused"] is False and info["weight_version"] == version


def test_update_weight_version_aborts_by_default_as_sglangs_does(engine: Engine) -> None:
    long = {"temperature": 1.0, "max_new_tokens": 5000, "ignore_eos": True}

    async def main() -> None:
        async with EngineClient(engine.url) as c, httpx.AsyncClient(base_url=engine.url, timeout=60) as http:
            version = (await c.get_model_info())["weight_version"]
            task = asyncio.create_task(c.generate([5, 6], sampling_params=long, rid="kept"))
            await wait_until_async(lambda: _running(c), 60, "the request to run")
            assert (await c.update_weight_version(version))["success"]  # the client keeps requests in flight
            assert not task.done() and await _running(c)
            resp = await http.post("/update_weight_version", json={"new_version": version})  # SGLang's default
            assert resp.status_code == 200
            assert (await task)["meta_info"]["finish_reason"]["type"] == "abort"
    asyncio.run(main())


def test_flush_cache_timeout_waits_for_the_requests(engine: Engine) -> None:
    async def main() -> None:
        async with EngineClient(engine.url) as c, httpx.AsyncClient(base_url=engine.url, timeout=300) as http:
            # long enough to be seen running between two polls of the load (48 tokens can finish unseen)
            sp = {"temperature": 1.0, "max_new_tokens": 256, "ignore_eos": True}
            task = asyncio.create_task(c.generate([7, 8], sampling_params=sp))
            await wait_until_async(lambda: _running(c), 60, "the request to run")
            resp = await http.post("/flush_cache?timeout=300")  # without the wait: a 400 while it runs
            assert resp.status_code == 200 and resp.json()["success"] is True
            assert (await task)["meta_info"]["finish_reason"] == {"type": "length", "length": 256}  # not aborted
    asyncio.run(main())


async def _running(c: EngineClient) -> bool:
    return (await c.get_server_info())["internal_states"][0]["running"] >= 1


def test_every_control_route_the_engine_serves_is_in_the_table() -> None:
    """A route added without its body's dataclass (and what it ignores) in bodies.ROUTES fails here."""
    from slimecli.engine.server import EngineServer
    from slimecli.engine.settings import EngineSettings

    app = EngineServer(EngineSettings("unused", port=0, device="cpu")).app()
    served = {r.resource.canonical for r in app.router.routes() if r.method in ("GET", "POST")}
    reads_nothing = {"/generate", "/get_model_info", "/model_info", "/get_server_info", "/server_info", "/get_load",
                     "/v1/loads"}  # /generate: protocol.py; the others are GETs that read no body
    assert served - reads_nothing == set(ROUTES)
