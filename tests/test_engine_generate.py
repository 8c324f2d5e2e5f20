"""/generate on a real engine process: shapes, batching, determinism, log-probs, stops, streaming."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoModelForCausalLM

from slimecli.config.schema import SlimeConfig
from tests.helpers.engine import Engine, hf_logprobs

PROMPTS = [[11, 22, 33, 44, 55], [7], [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100], [42, 43]]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def hf(engine: Engine):
    return AutoModelForCausalLM.from_pretrained(str(engine.model_path), attn_implementation="sdpa").eval()


def test_info_endpoints(engine: Engine) -> None:
    assert engine.get("/health").status_code == 200
    assert engine.get("/health_generate").status_code == 200
    for path in ("/get_model_info", "/model_info"):
        info = engine.get(path).json()
        assert info["model_path"] == str(engine.model_path) and info["is_generation"] is True
        assert info["weight_version"] == "default" and info["tokenizer_path"]
    for path in ("/get_server_info", "/server_info"):
        info = engine.get(path).json()
        assert info["context_length"] >= 32768
        assert info["max_running_requests"] == SlimeConfig().rollout.max_running_requests == 128  # the default
    assert engine.get("/no_such_route").status_code == 404
    assert engine.get("/no_such_route").json()["error"]["message"]


def test_single_text_reply_shape(engine: Engine) -> None:
    out = engine.generate(text="Hello, world", sampling_params={"max_new_tokens": 5, "ignore_eos": True})
    assert isinstance(out, dict)
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["completion_tokens"] == len(out["output_ids"]) == 5
    assert meta["prompt_tokens"] > 0 and meta["weight_version"] == "default" and meta["e2e_latency"] >= 0
    assert meta["id"] and "output_token_logprobs" not in meta
    assert isinstance(out["text"], str)


def test_batch_keeps_order_and_matches_singles(engine: Engine) -> None:
    batch = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert isinstance(batch, list) and len(batch) == len(PROMPTS)
    for prompt, out in zip(PROMPTS, batch, strict=True):
        single = engine.generate(input_ids=prompt, sampling_params=GREEDY)
        assert out["output_ids"] == single["output_ids"]
        assert out["meta_info"]["prompt_tokens"] == len(prompt)
    texts = engine.generate(text=["one two", "three"], sampling_params=[GREEDY, {**GREEDY, "max_new_tokens": 3}])
    assert [len(t["output_ids"]) for t in texts] == [12, 3]


def test_greedy_is_deterministic_and_top_k_1_is_greedy(engine: Engine) -> None:
    a = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
    b = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
    c = engine.generate(input_ids=PROMPTS[0], sampling_params={**GREEDY, "temperature": 1.3, "top_k": 1})
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]


def test_n_and_sampling_seed(engine: Engine) -> None:
    sp = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "n": 3, "sampling_seed": 1234}
    a = engine.generate(input_ids=PROMPTS[0], sampling_params=sp)
    b = engine.generate(input_ids=PROMPTS[0], sampling_params=sp)
    assert len(a) == 3 and [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    assert len({tuple(x["output_ids"]) for x in a}) > 1  # the copies draw different tokens
    batch = engine.generate(input_ids=PROMPTS[:2], sampling_params={**sp, "n": 2})
    assert len(batch) == 4 and [x["meta_info"]["prompt_tokens"] for x in batch] == [5, 5, 1, 1]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_hf_forward_at_temperature(engine: Engine, hf, temperature: float) -> None:
    sp = {"temperature": temperature, "max_new_tokens": 10, "ignore_eos": True, "top_p": 0.9, "sampling_seed": 5}
    outs = engine.generate(input_ids=PROMPTS, sampling_params=sp, return_logprob=True)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        entries = out["meta_info"]["output_token_logprobs"]
        assert [e[1] for e in entries] == out["output_ids"] and all(e[2] is None for e in entries)
        expected = hf_logprobs(hf, prompt, out["output_ids"], temperature or 1.0)
        assert [e[0] for e in entries] == pytest.approx(expected, abs=2e-4)


def test_input_and_top_logprobs(engine: Engine, hf) -> None:
    prompt = PROMPTS[2]
    out = engine.generate(input_ids=prompt, sampling_params=GREEDY, return_logprob=True, logprob_start_len=0,
                          top_logprobs_num=3, return_text_in_logprobs=True)
    meta = out["meta_info"]
    inp = meta["input_token_logprobs"]
    assert len(inp) == len(prompt) and inp[0][0] is None and [e[1] for e in inp] == prompt
    assert [e[0] for e in inp[1:]] == pytest.approx(hf_logprobs(hf, prompt[:1], prompt[1:], 1.0), abs=2e-4)
    tops = meta["output_top_logprobs"]
    assert len(tops) == len(out["output_ids"]) and all(len(t) == 3 for t in tops)
    for top, tok in zip(tops, out["output_ids"], strict=True):  # greedy: the sampled token is the top one
        assert top[0][1] == tok and isinstance(top[0][2], str)


def test_stop_token_ids_and_trim(engine: Engine) -> None:
    base = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["output_ids"]
    stop_id = base[3]
    cut = base.index(stop_id) + 1
    out = engine.generate(input_ids=PROMPTS[0], sampling_params={**GREEDY, "stop_token_ids": [stop_id]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["output_ids"] == base[:cut]
    kept = engine.generate(input_ids=PROMPTS[0], sampling_params={**GREEDY, "stop_token_ids": [stop_id],
                                                                   "no_stop_trim": True})
    assert len(kept["text"]) >= len(out["text"])
    assert kept["text"].startswith(out["text"])
    late = engine.generate(input_ids=PROMPTS[0], sampling_params={**GREEDY, "stop_token_ids": [base[0]],
                                                                   "min_new_tokens": 2})
    assert late["output_ids"][0] != base[0] or len(late["output_ids"]) > 1


def test_stop_strings(engine: Engine) -> None:
    full = engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY)
    text = full["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip()
    out = engine.generate(input_ids=PROMPTS[1], sampling_params={**GREEDY, "stop": [stop, "\x00never"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[:text.index(stop)]
    assert full["output_ids"][:len(out["output_ids"])] == out["output_ids"]
    kept = engine.generate(input_ids=PROMPTS[1], sampling_params={**GREEDY, "stop": stop, "no_stop_trim": True})
    assert stop in kept["text"]


def test_zero_new_tokens_and_long_input(engine: Engine) -> None:
    out = engine.generate(input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    ctx = engine.get("/get_server_info").json()["context_length"]
    resp = engine.post("/generate", {"input_ids": [5] * ctx, "sampling_params": {"max_new_tokens": 1}})
    assert resp.status_code == 400 and "context length" in resp.json()["error"]["message"]


def test_stream(engine: Engine) -> None:
    plain = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, return_logprob=True)
    chunks, done = [], False
    with httpx.stream("POST", engine.url + "/generate", json={"input_ids": PROMPTS[0], "sampling_params": GREEDY,
                                                              "return_logprob": True, "stream": True},
                      timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            chunks.append(json.loads(data))
    assert done and len(chunks) == 12
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert [len(c["output_ids"]) for c in chunks] == list(range(1, 13))
    last = chunks[-1]
    assert last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert len(last["meta_info"]["output_token_logprobs"]) == 12


def test_duplicate_rid_in_one_request(engine: Engine) -> None:
    resp = engine.post("/generate", {"input_ids": [[1], [2]], "rid": ["a", "a"]})
    assert resp.status_code == 400 and "rid" in resp.json()["error"]["message"]
    out = engine.generate(input_ids=[1, 2], rid="my-id", sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["id"] == "my-id"


def test_prefix_cache_serves_the_next_turn(engine: Engine, hf) -> None:
    turn1 = [(i * 37) % 3000 + 5 for i in range(300)]
    sp = {"temperature": 1.0, "max_new_tokens": 6, "ignore_eos": True}
    first = engine.generate(input_ids=turn1, sampling_params=sp)
    assert first["meta_info"]["cached_tokens"] == 0
    turn2 = turn1 + first["output_ids"] + [11, 12, 13]  # an agent's next request re-sends the whole context
    second = engine.generate(input_ids=turn2, sampling_params=sp, return_logprob=True)
    assert second["meta_info"]["cached_tokens"] == len(turn1) + len(first["output_ids"]) - 1
    lps = [e[0] for e in second["meta_info"]["output_token_logprobs"]]
    assert lps == pytest.approx(hf_logprobs(hf, turn2, second["output_ids"], 1.0), abs=2e-4)
    states = engine.get("/get_server_info").json()["internal_states"][0]
    assert states["prefix_cache_entries"] >= 1 and states["prefix_cache_hits"] >= 1
    assert engine.post("/flush_cache").status_code == 200
    assert engine.get("/get_server_info").json()["internal_states"][0]["prefix_cache_entries"] == 0
    again = engine.generate(input_ids=turn2, sampling_params=sp)
    assert again["meta_info"]["cached_tokens"] == 0
