"""Several teachers: the config (teachers, teacher_routes, teacher_default) and its rules with the messages users
see, the `teacher` group as a list of one, a plan entry per launched teacher, each sample scored by its source's
teacher over real loopback servers with per-teacher metrics and OPD coefficients, and a teacher of another
vocabulary refused with the reason."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
import torch
from aiohttp import web

from slimecli.config.compose import load as compose
from slimecli.config.groups.teacher import TeacherConfig, TeacherEntry
from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import SINGLE, find_teacher, route, run_teachers, teacher_view
from slimecli.launch.source_checks import load
from slimecli.rollout.collect import RolloutResult
from slimecli.rollout.sample import Sample
from slimecli.train import advantages as A
from slimecli.train.stages import opd_coefs
from tests.helpers import free_port
from tests.helpers.config_errors import errors_of

TWO = ["+recipe=opd", "teachers=[{name: math, url: 'http://127.0.0.1:7001'}, "
                      "{name: code, url: 'http://127.0.0.1:7002', opd_kl_coef: 0.25}]",
       "teacher_routes={gsm8k: math, mbpp: code}"]


# ---- config ---------------------------------------------------------------------------------------------------
def test_the_teacher_group_is_a_list_of_one():
    cfg = load(["+recipe=opd", "teacher.url=http://127.0.0.1:7999", "trainer.opd_kl_coef=0.5"])
    (t,) = run_teachers(cfg)
    assert (t.name, t.key, t.process, t.opd_kl_coef, t.settings) == (SINGLE, "teacher", "teacher", 0.5, cfg.teacher)
    assert route(cfg, "anything") == route(cfg, None) == SINGLE
    assert teacher_view(cfg, t) is cfg  # one teacher's processes and checks read the config as before
    assert run_teachers(load([])) == []


def test_listed_teachers_their_coefficients_and_routes():
    cfg = load([*TWO, "teacher_default=code", "trainer.opd_kl_coef=2.0"])
    math, code = run_teachers(cfg)
    assert (math.name, math.key, math.process, math.opd_kl_coef) == ("math", "teachers[0]", "teacher-math", 2.0)
    assert (code.settings.name, code.settings.url, code.opd_kl_coef) == ("server", "http://127.0.0.1:7002", 0.25)
    assert [route(cfg, s) for s in ("gsm8k", "mbpp", "other", None)] == ["math", "code", "code", "code"]
    assert route(load(TWO), "other") == "math"  # no teacher_default: the first
    assert teacher_view(cfg, code).teacher == code.settings
    with pytest.raises(KeyError, match="no teacher named 'zz'"):
        find_teacher(cfg, "zz")


def test_bad_teachers_are_refused_naming_the_field():
    msgs = errors_of(["+recipe=opd", "teachers=[{name: a, url: 'http://h:1'}, {name: a, kind: sglang}, "
                                     "{url: 'http://h:2'}, {name: 'b c', url: 'http://h:3'}]",
                      "teacher_routes={x: ab}", "teacher_default=zz"])
    assert "teachers[1].name: another teacher has this name (got 'a')" in msgs
    assert any(m.startswith("teachers[2].name: is required") for m in msgs)
    assert any(m.startswith("teachers[3].name: letters, digits") for m in msgs)
    assert "teachers[1].url: teachers[1].kind=sglang needs the URL of a running SGLang server (got None)" in msgs
    assert any(m.startswith("teacher_routes.x: names no teacher of the run (teachers: a, b c) (got 'ab')\n"
                            "    hint: did you mean 'a'?") for m in msgs)
    assert any(m.startswith("teacher_default: names no teacher of the run") for m in msgs)
    # a launched teacher needs its weights; two on one port clash
    msgs = errors_of(["+recipe=opd", "teachers=[{name: a}, {name: b, model_path: /x, port: 7100}, "
                                     "{name: c, model_path: /y, port: 7100}]"])
    assert any(m.startswith("teachers[0].model_path: teachers[0].kind=server needs teachers[0].model_path") for m in msgs)
    assert any(m.startswith("teachers[2].port: teacher b listens on 127.0.0.1:7100 too") for m in msgs)


def test_one_place_for_teachers_and_routes_need_a_teacher():
    (msg,) = errors_of([*TWO, "teacher.url=http://127.0.0.1:7999"])
    assert msg.startswith("teacher: the run has a `teachers` list: the teacher group's teacher would be left out")
    assert run_teachers(load(TWO))  # +recipe=opd's teacher=server with nothing of its own is no teacher
    (msg,) = errors_of(["teacher_routes={a: b}"])
    assert msg.startswith("teacher_routes.a: names no teacher of the run (teachers: none) (got 'b')")
    assert any(m.startswith("teacher_routes.gsm: no source of env.mix has this label") for m in errors_of(
        [*TWO[:2], "env=mix", "env.mix=[{name: gsm8k, env: native, id: lookup}]", "teacher_routes={gsm: math}"]))
    (msg,) = errors_of(["+recipe=opd", "teachers=[{name: s, kind: sglang, url: 'http://h:1'}]",
                        "rollout.temperature=0.7"])
    assert msg.startswith("rollout.temperature: teachers[0].kind=sglang scores at temperature 1 only")


# ---- the plan: one entry per launched teacher -----------------------------------------------------------------
def test_each_launched_teacher_is_planned_on_its_own_port(tmp_path):
    from slimecli.cli.plan import auto_port_keys
    from slimecli.launch.free_ports import with_free_ports
    from slimecli.launch.plan import build_plan

    cfg = compose(["+recipe=opd", f"model.path={tmp_path}", "teachers=[{name: a, model_path: /ta}, "
                "{name: b, model_path: /tb, tp: 2}, {name: c, url: 'http://127.0.0.1:9'}]"])
    assert auto_port_keys(cfg) == ["rollout.port", "teachers[0].port", "teachers[1].port"]
    launched = with_free_ports(cfg)
    specs = {s.name: s for s in build_plan(launched, tmp_path / "run")}
    assert [n for n in specs if n.startswith("teacher")] == ["teacher-a", "teacher-b"]  # c runs already
    a, b = specs["teacher-a"], specs["teacher-b"]
    assert a.argv[-2:] == ["--teacher", "a"] and b.argv[-2:] == ["--teacher", "b"]
    assert "--nproc" in b.argv and b.argv[b.argv.index("--nproc") + 1] == "2"  # tp=2: two ranks (launch/ranks.py)
    ports = [launched.teachers[0].port, launched.teachers[1].port]
    assert a.ports == ports[:1] and b.ports == ports[1:] and ports[0] != ports[1]
    assert b.probe is not None and b.probe.url == f"http://127.0.0.1:{ports[1]}/healthz"
    # the group's one teacher keeps its entry as it was
    group = with_free_ports(compose(["+recipe=opd", f"model.path={tmp_path}", "teacher.model_path=/t"]))
    (spec,) = [s for s in build_plan(group, tmp_path / "run") if s.name.startswith("teacher")]
    assert spec.name == "teacher" and "--teacher" not in spec.argv


def test_multi_node_agreed_ports_do_not_collide():
    cfg = compose(["+recipe=opd", "cluster.nnodes=2", "run.dir=/shared/run", "teachers=[{name: a, model_path: /a, every_node: true}, "
                "{name: b, model_path: /b, every_node: true}]"])
    from slimecli.config.layout import teacher_address

    a, b = (teacher_view(cfg, t) for t in run_teachers(cfg))
    assert [teacher_address(a, n)[1] for n in (0, 1)] == [7999, 8000]
    assert [teacher_address(b, n)[1] for n in (0, 1)] == [8001, 8002]


# ---- scoring: each sample by its own teacher ------------------------------------------------------------------
LOGP = {"math": -1.0, "code": -3.0}  # what each scripted teacher answers for every token


def _teacher_app(name: str, vocab_size: int, seen: list[str]) -> web.Application:
    """slimecli's teacher API (/generate, /info) answering LOGP[name] for every position."""

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(name)
        return web.json_response({"log_probs": [LOGP[name]] * (len(body["input_ids"]) - 1)})

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"server_type": "slimecli-teacher", "vocab_size": vocab_size, "model_path": "/nope"})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/info", info)
    return app


async def _serving(apps: dict[str, web.Application]) -> tuple[list[web.AppRunner], dict[str, str]]:
    runners, urls = [], {}
    for name, app in apps.items():
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls[name] = f"http://127.0.0.1:{port}"
    return runners, urls


def _config(urls: dict[str, str], model_path: str | None = None) -> SlimeConfig:
    base = SlimeConfig()
    return replace(base, teachers=(TeacherEntry(name="math", url=urls["math"]),
                                   TeacherEntry(name="code", url=urls["code"], opd_kl_coef=0.25)),
                   teacher_routes={"gsm8k": "math", "mbpp": "code"}, trainer=replace(TrainerConfig(), opd_kl_coef=1.0),
                   model=replace(base.model, path=model_path))


def _samples() -> list[Sample]:
    sources = ["gsm8k", "mbpp", "mbpp", None, "gsm8k", "other"]
    return [Sample(tokens=[5, 6, 7, 8, 9], response_length=3, rollout_log_probs=[-0.5] * 3, loss_mask=[1, 1, 0],
                   index=i, metadata={"source": s} if s else {}) for i, s in enumerate(sources)]


def test_each_sample_is_scored_by_its_sources_teacher():
    from slimecli.train.coordinator.teacher import TeacherScoring

    seen: list[str] = []

    async def run() -> tuple[list[Sample], dict[str, float]]:
        runners, urls = await _serving({n: _teacher_app(n, 4096, seen) for n in LOGP})
        try:
            scoring = TeacherScoring(_config(urls))
            samples = _samples()
            metrics = await scoring.score(RolloutResult(samples=samples, train_rewards=[0.0] * len(samples), metrics={}))
            await scoring.close()
            return samples, metrics
        finally:
            for r in runners:
                await r.cleanup()

    samples, metrics = asyncio.run(run())
    assert [s.teacher for s in samples] == ["math", "code", "code", "math", "math", "math"]
    for s in samples:  # each sample holds the scores of the teacher it names
        assert s.teacher_log_probs == [LOGP[s.teacher or ""]] * 3
    assert sorted(seen) == ["code"] * 2 + ["math"] * 4
    # k1 KL over trained tokens (mask [1, 1, 0]): student -0.5 minus the teacher's
    assert metrics["teacher/math/kl"] == pytest.approx(0.5) and metrics["teacher/code/kl"] == pytest.approx(2.5)
    assert metrics["teacher/math/tokens"] == 8.0 and metrics["teacher/code/tokens"] == 4.0
    assert metrics["teacher/math/latency_s"] > 0 and metrics["teacher/code/latency_s"] > 0
    # the OPD term of each sample uses its teacher's coefficient (code: 0.25, math: trainer.opd_kl_coef 1.0)
    cfg = _config({"math": "http://x", "code": "http://y"})
    coefs = opd_coefs(cfg, samples)
    assert coefs == [1.0, 0.25, 0.25, 1.0, 1.0, 1.0]
    adv = [torch.zeros(3) for _ in samples]
    student = [torch.full((3,), -0.5) for _ in samples]
    out = A.apply_opd(adv, student, A.teacher_log_probs(samples), coefs)
    assert out[0].tolist() == pytest.approx([-0.5] * 3) and out[1].tolist() == pytest.approx([-0.625] * 3)


def test_a_teacher_of_another_vocabulary_is_refused(tiny):
    from slimecli.train.coordinator.teacher import TeacherRefused, TeacherScoring

    student = tiny
    vocab = json.loads((student / "config.json").read_text())["vocab_size"]

    async def check(code_vocab: int) -> None:
        runners, urls = await _serving({"math": _teacher_app("math", vocab, []),
                                        "code": _teacher_app("code", code_vocab, [])})
        scoring = TeacherScoring(_config(urls, str(student)))
        try:
            await scoring.check(None)
        finally:
            await scoring.close()
            for r in runners:
                await r.cleanup()

    asyncio.run(check(vocab))  # the same vocabulary: no word
    with pytest.raises(TeacherRefused, match=rf"teacher code \(teachers\[1\]\.url=http://127.0.0.1:\d+\) cannot "
                                             rf"teach this student: its model's vocabulary has 1000 tokens, the "
                                             rf"student's \({student}\) {vocab}"):
        asyncio.run(check(1000))


def test_an_sglang_teacher_is_checked_by_its_tokenizer(tiny):
    from slimecli.model.loading import PROBE_TEXT, load_tokenizer
    from slimecli.teacher.client import TeacherClient
    from slimecli.teacher.vocab_check import vocabulary_problem

    student = tiny
    tok = load_tokenizer(student)
    ids = tok.encode(PROBE_TEXT, add_special_tokens=False)

    def app(shift: int) -> web.Application:
        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            assert body["text"] == PROBE_TEXT and body["sampling_params"]["max_new_tokens"] == 0
            entries = [[None, 0, None]] + [[-1.0, i + shift, None] for i in ids]  # a BOS first, as SGLang may
            return web.json_response({"text": "", "meta_info": {"input_token_logprobs": entries}})

        async def model_info(request: web.Request) -> web.Response:
            return web.json_response({"model_path": "elsewhere", "tokenizer_path": "elsewhere"})

        out = web.Application()
        out.router.add_post("/generate", generate)
        out.router.add_get("/get_model_info", model_info)
        return out

    async def problem(shift: int) -> str | None:
        runners, urls = await _serving({"t": app(shift)})
        try:
            async with TeacherClient(TeacherConfig(name="sglang", url=urls["t"])) as client:
                return await vocabulary_problem(client, str(student), str(student), tok)
        finally:
            await runners[0].cleanup()

    assert asyncio.run(problem(0)) is None
    assert "its tokenizer encodes a probe text to other ids" in (asyncio.run(problem(1)) or "")


def test_the_validate_line_names_the_teachers():
    from slimecli.cli.config import _teachers

    assert _teachers(load(TWO)) == "teachers=math,code"
    assert _teachers(load([])) == "teacher=none"


def test_a_resume_picks_each_teachers_port_afresh():
    from slimecli.config.convert import to_plain
    from slimecli.config.resume import compose_onto
    from slimecli.launch.rundir import config_changes

    stored = compose(TWO[:2])
    picked = replace(stored, teachers=tuple(replace(e, port=41000 + i) for i, e in enumerate(stored.teachers)))
    data, errors = compose_onto(to_plain(picked), ["trainer.max_steps=9"])
    assert errors == [] and [e["port"] for e in data["teachers"]] == ["auto", "auto"]
    again = replace(picked, teachers=tuple(replace(e, port=42000 + i) for i, e in enumerate(picked.teachers)))
    assert config_changes(picked, again, []) == []  # where a teacher listens is no part of a resume
    longer = replace(picked, teachers=tuple(replace(e, request_timeout_s=5.0) for e in picked.teachers))
    assert [k for k, _ in config_changes(picked, longer, [])] == ["teachers.0.request_timeout_s",
                                                                  "teachers.1.request_timeout_s"]


def test_a_launched_teachers_machine_checks_name_its_own_keys(tiny):
    import socket

    from slimecli.launch.preflight import server_errors

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = compose(["+recipe=opd", f"model.path={tiny}", f"teachers=[{{name: a, model_path: '{tiny}'}}, "
                                                            f"{{name: b, model_path: '{tiny}', port: {port}}}]"])
        errors = [e for e in server_errors(cfg) if e.path.startswith("teacher")]
    assert [(e.path, e.value) for e in errors] == [("teachers[1].port", port)]
    assert errors[0].hint == "stop what listens there, or choose another teachers[1].port"
