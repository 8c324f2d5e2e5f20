"""Contracts with the released SGLang (0.5.23), checked by SGLang's own code on a machine without a GPU.

- every argv `plan` writes for `rollout=sglang` passes SGLang's own argument parser (`ServerArgs`);
- every request body slimecli's engine client, rollout driver and teacher=sglang client send passes the request
  schema SGLang's HTTP server validates it with (pydantic over io_struct, /generate's contract gate), and
  carries no field SGLang would silently drop;
- the weight-update group: slimecli's rank 0 and SGLang's own `init_custom_process_group` on the engine side
  form the group over gloo and a broadcast arrives (what SGLang's receive loop does per tensor).

sglang comes from `make sglang-contract` (tests/helpers/sglang_contract.py says what is stubbed); without it
these tests are skipped and say so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import sglang_contract

ROOT = Path(__file__).resolve().parent.parent

SGL: Any = None


@pytest.fixture(scope="module", autouse=True)
def sglang() -> Any:
    """SGLang's modules, imported when the first test here runs (not at collection: every worker collects)."""
    global SGL
    SGL = sglang_contract.load()
    if isinstance(SGL, str):
        pytest.skip(SGL)
    return SGL


def test_loading_sglang_leaves_the_worker_as_it_was():
    """The stubs and sglang's directory exist only while sglang imports: a later test of this worker that draws a
    figure (matplotlib reads IPython's version from sys.modules) or imports starlette gets the real thing."""
    assert not [name for name, module in sys.modules.items() if isinstance(module, sglang_contract._Stub)]
    assert not [f for f in sys.meta_path if isinstance(f, sglang_contract._StubFinder)]
    assert str(sglang_contract.TARGET) not in sys.path
    from matplotlib.figure import Figure

    Figure()  # what failed, when the report tests ran after these in one worker


PLANS = [
    ["rollout=sglang"],
    ["rollout=sglang", "rollout.num_engines=2", "rollout.sglang_args=--tp-size 2 --mem-fraction-static 0.7",
     "rollout.sglang_engine_args=[--context-length 4096,--enable-metrics]", "rollout.api_key=k",
     "model.trust_remote_code=true", "rollout.dtype=bfloat16"],
    ["+recipe=swe_agent_smoke", "rollout=sglang", "agent.constrain=tool_calls"],
]


def _parse(argv: list[str]) -> Any:
    parser = argparse.ArgumentParser(exit_on_error=False)
    SGL.ServerArgs.add_cli_args(parser)
    namespace = parser.parse_args(argv)
    return SGL.ServerArgs.from_cli_args(namespace)


@pytest.mark.parametrize("overrides", PLANS, ids=["default", "two-engines-tp2", "constrained-agent"])
def test_sglang_parser_accepts_every_argv_plan_writes(overrides, tiny):
    from slimecli.config.compose import load
    from slimecli.launch.plan import engine_specs

    cfg = load([*overrides, "rollout.port=31000", f"model.path={tiny}"])
    specs = engine_specs(cfg, "/run/config.yaml")
    assert specs
    for spec in specs:
        assert spec.argv[1:3] == ["-m", "sglang.launch_server"]
        args = _parse(spec.argv[3:])
        assert (args.model_path, args.port, args.dtype) == (str(tiny), spec.ports[0], cfg.rollout.dtype)
        assert args.skip_server_warmup and args.base_gpu_id >= cfg.trainer.nproc
        if "agent.constrain=tool_calls" in overrides:
            assert args.grammar_backend == "llguidance"


def test_the_parser_is_strict():
    """The check above can fail: a flag SGLang does not know, or a bad value, is refused."""
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse(["--model-path", "m", "--no-such-flag"])
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse(["--model-path", "m", "--dtype", "fp7"])


def test_preflight_refuses_sglang_args_that_sglangs_parser_refuses_naming_the_field(tiny):
    from slimecli.config.compose import load
    from slimecli.launch.sglang_checks import sglang_args_errors
    from tests.helpers import invoke_cli

    good = load(["rollout=sglang", "rollout.num_engines=2", "rollout.sglang_args=--tp-size 2 --mem-fraction-static 0.7",
                 "rollout.sglang_engine_args=[--context-length 4096,--enable-metrics]"])
    assert sglang_args_errors(good) == []
    bad = load(["rollout=sglang", "rollout.num_engines=2", "rollout.sglang_args=--tp-sise 2",
                "rollout.sglang_engine_args=[--context-length 4096,--dtype fp7]"])
    errors = {e.path: e for e in sglang_args_errors(bad)}
    assert set(errors) == {"rollout.sglang_args", "rollout.sglang_engine_args[1]"}
    assert "--tp-sise" in errors["rollout.sglang_args"].reason and "'--tp-size'" in errors["rollout.sglang_args"].hint
    assert "fp7" in errors["rollout.sglang_engine_args[1]"].reason
    # through the command: exit 2, the field, the value and the hint, no traceback
    result = invoke_cli("config", "validate", "rollout=sglang", "rollout.sglang_args=--tp-sise 2", f"model.path={tiny}")
    assert result.returncode == 2, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "rollout.sglang_args" in out and "--tp-sise" in out and "--tp-size" in out and "Traceback" not in out


# ---- request bodies ----------------------------------------------------------------------------------------
SCHEMAS = {  # path -> SGLang's request type for it (http_server.py)
    "/pause_generation": "PauseGenerationReqInput", "/continue_generation": "ContinueGenerationReqInput",
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/begin_weight_update": "BeginWeightUpdateReqInput", "/end_weight_update": "EndWeightUpdateReqInput",
    "/abort_request": "AbortReq", "/update_weight_version": "UpdateWeightVersionReqInput",
}


def schema_errors(path: str, body: Any) -> list[str]:
    """What SGLang's server would refuse or drop in this body ([] when it takes all of it)."""
    import msgspec
    import pydantic

    io = SGL.io_struct
    if path == "/flush_cache":  # no body is read
        return []
    if path == "/generate":
        try:
            request = pydantic.TypeAdapter(io.GenerateReqInput).validate_python(body)
            request.normalize_batch_and_arguments()
        except Exception as exc:  # noqa: BLE001 - the refusal is the finding
            return [f"GenerateReqInput: {exc}"]
        error = SGL.api_contract.generate_contract_error(body)
        return [error] if error else []
    cls = getattr(io, SCHEMAS[path])
    try:
        pydantic.TypeAdapter(cls).validate_python(body)
    except Exception as exc:  # noqa: BLE001
        return [f"{cls.__name__}: {exc}"]
    fields = {f.name for f in msgspec.structs.fields(cls)}
    return [f"{cls.__name__} drops {sorted(set(body) - fields)}"] if set(body) - fields else []


class Recorder:
    """An SGLang stand-in on loopback that records every request body and answers success."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, Any]] = []

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json() if request.can_read_body else None
        self.bodies.append((request.path, body))
        if request.path == "/generate":
            ids, sp = body.get("input_ids") or [], body.get("sampling_params") or {}
            ids = ids[0] if ids and isinstance(ids[0], list) else ids  # a batch: one reply per entry
            n = len(sp) if isinstance(sp, list) else sp.get("n", 1)
            meta = {"id": "x", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": len(ids),
                    "completion_tokens": 1, "output_token_logprobs": [[-0.5, 7, None]],
                    "input_token_logprobs": [[None, ids[0], None]] + [[-1.0, t, None] for t in ids[1:]]}
            reply = {"text": "a", "output_ids": [7], "meta_info": meta}
            return web.json_response([reply] * n if n > 1 else reply)
        if request.path == "/server_info":
            return web.json_response({"tp_size": 1})
        return web.json_response({"success": True, "message": ""})


def test_every_body_slimecli_sends_passes_sglangs_request_schema():
    from aiohttp import web

    from slimecli.config.compose import load
    from slimecli.rollout.client import EngineClient
    from slimecli.rollout.driver import RolloutDriver
    from slimecli.teacher.client import TeacherClient
    from tests.helpers import free_port

    cfg = load(["rollout.temperature=0.7", "rollout.top_k=20"])
    recorder = Recorder()

    async def drive() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", recorder.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with EngineClient(url) as engine:
                params = RolloutDriver.sampling_params(type("D", (), {"cfg": cfg})(), 32)  # type: ignore[arg-type]
                await engine.generate(input_ids=[1, 2, 3], sampling_params={**params, "n": 4}, return_logprob=True)
                await engine.generate(input_ids=[[1, 2, 3]] * 2, return_logprob=True,  # the driver's seeded group
                                      sampling_params=[{**params, "sampling_seed": s} for s in (1, (1 << 63) - 1)])
                await engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 8, "stop": ["\n"],
                                                                         "stop_token_ids": [2], "ebnf": "start: \"a\""},
                                      return_logprob=True, rid="r1")
                await engine.sync_weights("/ckpt/step_1", 1)
                await engine.init_weights_update_group("127.0.0.1", 29500, 1, 2, "g", "nccl")
                assert await engine.begin_weight_update()
                await engine.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 3]], "g", 2, flush_cache=False)
                await engine.end_weight_update()
                await engine.destroy_weights_update_group("g")
                await engine.update_weight_version(3)
                await engine.abort(all=True)
                await engine.abort(rid="r1")
                assert (await engine.get_server_info())["tp_size"] == 1
            teacher = load(["teacher=sglang", f"teacher.url={url}"]).teacher
            async with TeacherClient(teacher, url=url) as client:
                await client._score_sglang([1, 2, 3, 4], 2)
        finally:
            await runner.cleanup()

    asyncio.run(drive())
    paths = [p for p, _ in recorder.bodies]
    assert {"/generate", "/update_weights_from_distributed", "/begin_weight_update", "/pause_generation",
            "/update_weights_from_disk", "/abort_request", "/server_info", "/update_weight_version"} <= set(paths)
    assert "/get_server_info" not in paths  # the current name first
    problems = {f"{path} {json.dumps(body)}": schema_errors(path, body) for path, body in recorder.bodies
                if body is not None}
    assert not {k: v for k, v in problems.items() if v}


def test_the_recorded_control_structs_are_sglangs():
    """tests/data/sglang_control_structs.json, which test_engine_control_bodies.py holds the engine's control
    bodies to, is SGLang's io_struct: the same fields, the same required ones, the same defaults."""
    import msgspec

    recorded = json.loads((ROOT / "tests" / "data" / "sglang_control_structs.json").read_text())
    assert recorded["sglang"] == SGL.version
    for name, struct in recorded["structs"].items():
        fields = msgspec.structs.fields(getattr(SGL.io_struct, name))
        assert struct["required"] == [f.name for f in fields if f.required], name
        assert struct["defaults"] == {f.name: f.default for f in fields if not f.required}, name


def test_the_schema_check_is_strict():
    assert schema_errors("/init_weights_update_group", {"master_address": "h", "master_port": "x",
                                                        "rank_offset": 1, "world_size": 2})
    assert schema_errors("/update_weights_from_disk", {"model_path": "/m", "no_such_field": 1})
    assert schema_errors("/generate", {"input_ids": [1], "sampling_params": {"no_such_param": 1}})


# ---- the weight-update group --------------------------------------------------------------------------------
TRAINER_SIDE = textwrap.dedent("""
    import sys, torch
    import torch.distributed as dist
    from slimecli.engine.weight_transfer import destroy_weight_group, init_weight_group
    group = init_weight_group("gloo", "127.0.0.1", int(sys.argv[1]), 2, 0, "slimecli_weight_update", 120.0)
    dist.broadcast(torch.full((3, 4), 0.5, dtype=torch.bfloat16), src=0, group=group)
    destroy_weight_group(group)
    del group  # as the trainer's WeightGroup.close drops it: left to the interpreter's teardown, the group and the
    # TCPStore this rank hosts ended the process with SIGABRT ("terminate called without an active exception")
    # in 5 runs of 57
""")


def test_weight_group_handshake_with_sglangs_own_process_group_code():
    """slimecli's rank 0 in a process of its own (torch only); the engine side here, where sglang is already
    imported: SGLang's own init_custom_process_group joins the group and receives as its loop does."""
    import torch
    import torch.distributed as dist

    from tests.helpers import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER_SIDE, str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        group = SGL.init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2,
                                              rank=1, group_name="slimecli_weight_update")
        weights = torch.empty(3, 4, dtype=torch.bfloat16)  # as SGLang's receive loop allocates each tensor
        dist.broadcast(weights, src=0, group=group)
        dist.destroy_process_group(group)
        _, err = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
        trainer.wait()
    assert trainer.returncode == 0, err[-3000:]
    assert weights.float().sum().item() == 6.0
