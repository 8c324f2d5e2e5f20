"""Clients written for SGLang work unchanged against the embedded engine (issue 16, SGLang compatibility).

Every field of SGLang's SamplingParams is accepted (implemented, or ignored exactly where a default SGLang
server ignores it), and every reply has the shape SGLang gives: tests/data/sglang_shapes.jsonl records it,
from SGLang's source, for each combination of return_logprob, top_logprobs_num, token_ids_logprob,
logprob_start_len, return_text_in_logprobs, stream, batch and n, and prefill-only scoring.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from slimecli.engine import compat
from slimecli.engine.protocol import CONSTRAINT_KEYS, SAMPLING_KEYS
from slimecli.rollout.client import EngineClient
from tests.helpers import wait_until_async
from tests.helpers.engine import Engine

SHAPES = Path(__file__).parent / "data" / "sglang_shapes.jsonl"
HEADER, *CASES = [json.loads(line) for line in SHAPES.read_text().splitlines() if line.strip()]
FRAGMENTS: dict[str, Any] = HEADER["fragments"]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PROMPT = [11, 22, 33, 44, 55]

# sglang 0.5.23 SamplingParams (srt/sampling/sampling_params.py), its API fields, with a value a client may send.
SGLANG_SAMPLING_FIELDS: dict[str, Any] = {
    "max_new_tokens": 4, "stop": ["\x00never"], "stop_token_ids": [3], "stop_regex": [r"\x00+never"],
    "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.01, "frequency_penalty": 0.1,
    "presence_penalty": 0.1, "repetition_penalty": 1.05, "min_new_tokens": 1, "n": 1, "json_schema": None,
    "regex": None, "ebnf": None, "structural_tag": None, "ignore_eos": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "no_stop_trim": True, "stream_interval": 2,
    "logit_bias": {"7": 0.5}, "sampling_seed": 3, "custom_params": {"return_top_p_token_ids": True},
    "beam_width": 1, "watermark": {"enabled": False},
}


def test_every_sglang_sampling_field_is_known() -> None:
    assert set(SGLANG_SAMPLING_FIELDS) == SAMPLING_KEYS | set(CONSTRAINT_KEYS) | compat.COMPAT_SAMPLING_KEYS


def test_every_sglang_sampling_field_is_accepted(engine: Engine) -> None:
    out = engine.generate(input_ids=PROMPT, sampling_params=SGLANG_SAMPLING_FIELDS)
    assert len(out["output_ids"]) == 4
    for key, value in SGLANG_SAMPLING_FIELDS.items():  # each alone too, and null (= SGLang's default)
        for v in (value, None):
            resp = engine.post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, key: v}})
            assert resp.status_code == 200, (key, v, resp.text)


def test_reference_clients_custom_params(engine: Engine) -> None:
    """slime sends custom_params {"return_top_p_token_ids": true} whenever top_p < 1: accepted and ignored."""
    sp = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True, "top_p": 0.9, "sampling_seed": 1}
    plain = engine.generate(input_ids=PROMPT, sampling_params=sp, return_logprob=True)
    custom = engine.generate(input_ids=PROMPT, sampling_params={**sp, "custom_params": {"return_top_p_token_ids": True}},
                             return_logprob=True)
    assert custom["output_ids"] == plain["output_ids"]
    lps = [[e[0] for e in x["meta_info"]["output_token_logprobs"]] for x in (plain, custom)]
    assert lps[1] == pytest.approx(lps[0], abs=1e-5)


@pytest.mark.parametrize(("sp", "body", "field"), [
    ({"tempurature": 1}, {}, "tempurature"),
    ({"choice": ["a", "b"]}, {}, "choice"),  # in SGLang's JSON contract, not in the Python server's SamplingParams
    ({"stop_strs": ["x"]}, {}, "stop_strs"),  # SGLang-internal fields are not part of the API
    ({"beam_width": 2}, {}, "beam_width"),
    ({"beam_width": 0}, {}, "beam_width"),
    ({"structural_tag": '{"type": "structural_tag"}'}, {}, "structural_tag"),
    ({"watermark": {"enabled": True}}, {}, "watermark"),
    ({"watermark": {}}, {}, "watermark"),
    ({"watermark": {"enabled": False, "bogus": 1}}, {}, "watermark"),
    ({"logit_bias": {"99999": 1.0}}, {}, "logit_bias"),
    ({"logit_bias": {"x": 1.0}}, {}, "logit_bias"),
    ({"logit_bias": [1]}, {}, "logit_bias"),
    ({"stop_regex": "("}, {}, "stop_regex"),
    ({"stop_regex": [""]}, {}, "stop_regex"),
    ({"stop_regex": ["a"] * 33}, {}, "stop_regex"),
    ({"stream_interval": -1}, {}, "stream_interval"),
    ({"custom_params": {compat.REASONING_END_KEY: []}}, {}, compat.REASONING_END_KEY),
    ({}, {"token_ids_logprob": [99999]}, "token_ids_logprob"),
    ({}, {"token_ids_logprob": [[1], [2]]}, "token_ids_logprob"),
    ({"n": 2}, {"input_ids": [[1], [2]], "token_ids_logprob": [[1], [2]]}, "token_ids_logprob"),
    ({}, {"watermark": {"key": "k"}}, "watermark"),
    ({}, {"custom_logit_processor": "x"}, "custom_logit_processor"),
    ({}, {"return_logprob": True, "logprob_start_len": 6}, "logprob_start_len"),
])
def test_what_sglang_refuses_is_a_400_naming_the_field(engine: Engine, sp: dict, body: dict,
                                                      field: str) -> None:
    resp = engine.post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, **sp}, **body})
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["error"]["message"]


def test_top_level_fields_sglang_ignores(engine: Engine) -> None:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}, "log_metrics": True, "priority": 3,
            "extra_key": "k", "cache_salt": "s", "routing_key": "r", "custom_labels": {"a": "b"},
            "return_hidden_states": False, "lora_path": None, "routed_experts_start_len": 0,
            "watermark": {"enabled": False}, "return_prompt_token_ids": True}
    out = engine.generate(**body)
    assert out["prompt_token_ids"] == PROMPT and len(out["output_ids"]) == 2


def test_logit_bias_steers_the_draw(engine: Engine) -> None:
    out = engine.generate(input_ids=PROMPT, sampling_params={"max_new_tokens": 6, "ignore_eos": True,
                                                             "logit_bias": {"1234": 100.0}})
    assert out["output_ids"] == [1234] * 6
    greedy = engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, "max_new_tokens": 4})["output_ids"]
    banned = engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, "max_new_tokens": 4,
                                                                "logit_bias": {str(greedy[0]): -100.0}})
    assert banned["output_ids"][0] != greedy[0]


def test_stop_regex(engine: Engine) -> None:
    full = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)
    text = full["text"]
    piece = text[len(text) // 2:len(text) // 2 + 2]
    assert piece.strip()
    pattern = re.escape(piece[0]) + "."  # a pattern, not a literal: SGLang reports the pattern as matched
    out = engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, "stop_regex": [r"\x00never", pattern]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert full["output_ids"][:len(out["output_ids"])] == out["output_ids"]
    assert len(out["output_ids"]) < len(full["output_ids"]) and re.search(pattern, out["text"])


def _sse(url: str, body: dict) -> tuple[list[dict], bool]:
    chunks, done = [], False
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                else:
                    assert not done, "a chunk after [DONE]"
                    chunks.append(json.loads(data))
    return chunks, done


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    yield engine.url


def test_stream_interval(url: str) -> None:
    chunks, done = _sse(url, {"input_ids": PROMPT, "stream": True, "sampling_params": {**GREEDY, "stream_interval": 3}})
    assert done and [len(c["output_ids"]) for c in chunks] == [1, 4, 7, 10, 12]


def test_weight_version_spans() -> None:
    assert compat.weight_version_spans([], "v1", 5) == [{"version": "v1", "start": 0, "end": 5}]
    assert compat.weight_version_spans([("v0", 2)], "v1", 5) == [{"version": "v0", "start": 0, "end": 2},
                                                                  {"version": "v1", "start": 2, "end": 5}]
    assert compat.weight_version_spans([("v1", 2)], "v1", 5) == [{"version": "v1", "start": 0, "end": 5}]


# ---- the recorded corpus ---------------------------------------------------------------------------------
def _length(expr: str, env: dict[str, int]) -> int:
    total, sign = 0, 1
    for tok in re.findall(r"[+-]|\w+", expr.replace(" ", "")):
        if tok in "+-":
            sign = 1 if tok == "+" else -1
        else:
            total += sign * (int(tok) if tok.isdigit() else env[tok])
    return total


def _is(kind: str, value: Any) -> bool:
    return {"str": isinstance(value, str), "null": value is None, "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool)}[kind]


def check(shape: Any, value: Any, env: dict[str, Any], path: str) -> None:
    """value has the recorded shape (see the corpus header for the language)."""
    if isinstance(shape, str) and shape.startswith("@"):
        return check(FRAGMENTS[shape[1:]], value, env, path)
    if isinstance(shape, str) and shape.startswith("$"):
        return check(env[shape[1:]], value, env, path)
    if isinstance(shape, str):
        assert any(_is(k, value) for k in shape.split("|")), f"{path}: {value!r} is not {shape}"
    elif "object" in shape:
        assert isinstance(value, dict), f"{path}: {value!r} is not an object"
        want, got = set(shape["object"]), set(value)
        assert want == got, f"{path}: keys differ: missing {sorted(want - got)}, unexpected {sorted(got - want)}"
        for k, sub in shape["object"].items():
            check(sub, value[k], env, f"{path}.{k}")
    elif "tuple" in shape:
        assert isinstance(value, list) and len(value) == len(shape["tuple"]), f"{path}: {value!r}"
        for i, (sub, v) in enumerate(zip(shape["tuple"], value, strict=True)):
            check(sub, v, env, f"{path}[{i}]")
    else:
        assert isinstance(value, list), f"{path}: {value!r} is not a list"
        expr = env[shape["len"][1:]] if shape["len"].startswith("$") else shape["len"]
        n = _length(expr, env)
        assert len(value) == n, f"{path}: {len(value)} entries, SGLang gives {shape['len']} = {n}"
        for i, v in enumerate(value):
            check(shape["first"] if i == 0 and "first" in shape else shape["list"], v, env, f"{path}[{i}]")


def check_item(case: dict, item: dict, finished: bool) -> None:
    meta: dict[str, Any] = {}
    for frag in [*case["meta_info"], "meta_finished" if finished else "meta_running"]:
        meta.update(FRAGMENTS[frag])
    shape = {"object": {**FRAGMENTS["reply"], "meta_info": {"object": meta}, **({"index": "int"} if case["index"]
                                                                               else {})}}
    info = item.get("meta_info") or {}
    env = {**case["vars"], "P": info.get("prompt_tokens", -1), "C": info.get("completion_tokens", -1)}
    check(shape, item, env, case["name"])
    for key, want in case.get("expect", {}).items():
        assert info[key] == want, f"{case['name']}: meta_info.{key} = {info[key]!r}, SGLang gives {want!r}"
    req = case["request"]
    start = req.get("logprob_start_len", -1)
    if "input_ids" in req and start >= 0 and not isinstance(req["input_ids"][0], list):
        assert [e[1] for e in info["input_token_logprobs"]] == req["input_ids"][start:]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_reply_matches_recorded_sglang_shape(url: str, case: dict) -> None:
    body = case["request"]
    if case["reply"] != "stream":
        resp = httpx.post(url + "/generate", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        data = resp.json()
        items = data if case["reply"] == "list" else [data]
        assert isinstance(data, list) == (case["reply"] == "list"), f"{case['name']}: {type(data).__name__}"
        assert len(items) == case["items"]
        for item in items:
            check_item(case, item, finished=True)
        return
    chunks, done = _sse(url, body)
    assert done, "no data: [DONE]"
    by_item: dict[int, list[dict]] = {}
    for c in chunks:
        by_item.setdefault(c.get("index", 0), []).append(c)
    assert sorted(by_item) == list(range(case["items"]))
    for seq in by_item.values():
        assert len(seq) == case["chunks_per_item"]
        for i, c in enumerate(seq):
            check_item(case, c, finished=i == len(seq) - 1)


def test_weight_versions_and_retractions(engine: Engine) -> None:
    """meta_info.weight_versions spans a weight update the request lived through; num_retractions counts."""
    sp = {"temperature": 1.0, "max_new_tokens": 300, "ignore_eos": True}

    async def running(c: EngineClient) -> None:
        async def started() -> bool:
            return (await c.get_server_info())["internal_states"][0]["running"] >= 1

        await wait_until_async(started, 60, "the request to start running")

    async def main() -> None:
        async with EngineClient(engine.url) as c:
            task = asyncio.create_task(c.generate([3, 4], sampling_params=sp))
            await running(c)
            await c.pause(mode="in_place")
            assert (await c.update_weights_from_disk(str(engine.model_path), weight_version="v2"))["success"]
            await c.resume()
            meta = (await task)["meta_info"]
            spans = meta["weight_versions"]
            assert [s["version"] for s in spans] == ["default", "v2"] and meta["weight_version"] == "v2"
            assert spans[0]["start"] == 0 < spans[0]["end"] == spans[1]["start"] < spans[1]["end"] == 300
            assert meta["num_retractions"] == 0
            task = asyncio.create_task(c.generate([3, 4], sampling_params=sp))
            await running(c)
            await c.pause(mode="retract")
            await c.resume()
            meta = (await task)["meta_info"]
            assert meta["num_retractions"] == 1 and meta["weight_versions"] == [
                {"version": "v2", "start": 0, "end": 300}]

    async def restore() -> None:  # the engine is shared: the same weights under their first version again
        async with EngineClient(engine.url) as c:
            assert (await c.update_weights_from_disk(str(engine.model_path), weight_version="default"))["success"]
    try:
        asyncio.run(main())
    finally:
        asyncio.run(restore())
