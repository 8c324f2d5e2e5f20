"""Structured outputs (regex / json_schema / ebnf) on a real engine process, with the random tiny model at T=1.

The random model puts mass on nearly every token, so only the grammar masks keep the outputs in their
languages: any leak shows up within a few dozen samples.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimecli.engine.grammar import GrammarCache, allowed_tokens
from slimecli.engine.protocol import BadRequest, Constraint
from slimecli.model.loading import load_tokenizer
from slimecli.rollout.client import EngineClient
from tests.helpers import ROOT
from tests.helpers.engine import Engine

PROMPT = [11, 22, 33, 44, 55]
REGEX = r"[0-9]{3}-[a-z]{2}"
SCHEMA = {"type": "object",
          "properties": {"count": {"type": "integer", "minimum": 0, "maximum": 999},
                         "color": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["count", "color"], "additionalProperties": False}
EBNF = 'root ::= greet " " name ("," " " name)? "!"\ngreet ::= "hello" | "hi" | "hey"\nname ::= [a-z] [a-z] [a-z]?\n'
EBNF_AS_REGEX = r"(hello|hi|hey) [a-z]{2,3}(, [a-z]{2,3})?!"


def _eos_ids(model_path: Path) -> set[int]:
    """The engine's end-of-text ids: generation config, model config and tokenizer, as the server gathers them."""
    cfg = json.loads((model_path / "generation_config.json").read_text())["eos_token_id"]
    cfg = cfg if isinstance(cfg, list) else [cfg]
    return set(cfg) | {load_tokenizer(model_path).eos_token_id}


def _check_stop(out: dict, eos: set[int]) -> None:
    fin = out["meta_info"]["finish_reason"]
    assert fin["type"] == "stop" and fin["matched"] in eos, fin
    assert out["output_ids"][-1] in eos


def test_regex_holds_over_many_seeds(engine: Engine) -> None:
    eos = _eos_ids(engine.model_path)
    sp = {"regex": REGEX, "temperature": 1.0, "max_new_tokens": 32}
    outs = engine.generate(input_ids=PROMPT, sampling_params={**sp, "n": 48, "sampling_seed": 7})
    outs += engine.generate(input_ids=[PROMPT, [7], [300, 301]], sampling_params={**sp, "n": 8})  # unseeded
    for out in outs:
        assert re.fullmatch(REGEX, out["text"]), out["text"]
        _check_stop(out, eos)
    assert len({o["text"] for o in outs}) > 20  # sampled, not forced into one string


def test_json_schema_output_parses_and_validates(engine: Engine) -> None:
    eos = _eos_ids(engine.model_path)
    outs = engine.generate(input_ids=PROMPT, sampling_params={
        "json_schema": json.dumps(SCHEMA), "max_new_tokens": 64, "n": 24, "sampling_seed": 3})
    for out in outs:
        obj = json.loads(out["text"])
        assert set(obj) == {"count", "color"}, obj
        assert isinstance(obj["count"], int) and not isinstance(obj["count"], bool) and 0 <= obj["count"] <= 999
        assert obj["color"] in ("red", "green", "blue")
        _check_stop(out, eos)
    assert len({json.loads(o["text"])["color"] for o in outs}) > 1


def test_ebnf_output_is_in_the_language(engine: Engine) -> None:
    eos = _eos_ids(engine.model_path)
    outs = engine.generate(text="Say hi:", sampling_params={"ebnf": EBNF, "max_new_tokens": 48, "n": 24,
                                                            "sampling_seed": 11})
    for out in outs:
        assert re.fullmatch(EBNF_AS_REGEX, out["text"]), out["text"]
        _check_stop(out, eos)


def test_logprobs_are_the_masked_renormalised_distribution(engine: Engine) -> None:
    hf = AutoModelForCausalLM.from_pretrained(str(engine.model_path), attn_implementation="sdpa").eval()
    vocab = hf.config.vocab_size
    cache = GrammarCache(lambda: load_tokenizer(engine.model_path), vocab, _eos_ids(engine.model_path))
    schema = json.dumps(SCHEMA)
    for kind, text, temperature in (("regex", REGEX, 0.7), ("json_schema", schema, 1.0), ("regex", REGEX, 0.0)):
        out = engine.generate(input_ids=PROMPT, return_logprob=True, top_logprobs_num=5, sampling_params={
            kind: text, "temperature": temperature, "max_new_tokens": 64, "sampling_seed": 5})
        ids = out["output_ids"]
        got = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1:-1].float()
        matcher = cache.compile(Constraint(kind, text)).matcher()
        want = []
        t = temperature if temperature > 1e-5 else 1.0
        for step, tok in enumerate(ids):
            ok = allowed_tokens([matcher], vocab)[0]
            lp = torch.log_softmax(logits[step].masked_fill(~ok, float("-inf")) / t, dim=-1)
            want.append(lp[tok].item())
            tops = out["meta_info"]["output_top_logprobs"][step]
            assert tops and all(ok[e[1]] and e[0] <= 0 for e in tops)  # candidates come from the mask too
            assert matcher.consume(tok)
        assert matcher.stopped
        assert got == pytest.approx(want, abs=2e-4), (kind, temperature)
        assert all(lp <= 0 and lp > float("-inf") for lp in got)


@pytest.mark.parametrize(("sp", "field", "words"), [
    ({"regex": "[0-9", "json_schema": "{}"}, "sampling_params", "exclude each other"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "sampling_params", "exclude each other"),
    ({"regex": "[0-9"}, "sampling_params.regex", "invalid regex"),
    ({"regex": "(?=a)b"}, "sampling_params.regex", "invalid regex"),
    ({"regex": 5}, "sampling_params.regex", "must be a string"),
    ({"regex": ""}, "sampling_params.regex", "is empty"),
    ({"json_schema": "{not json"}, "sampling_params.json_schema", "invalid JSON schema"),
    ({"json_schema": '{"type": "no-such-type"}'}, "sampling_params.json_schema", "invalid JSON schema"),
    ({"json_schema": '{"type": "object", "required": 5}'}, "sampling_params.json_schema", "invalid JSON schema"),
    ({"json_schema": {"type": "object"}}, "sampling_params.json_schema", "serialised as a string"),
    ({"ebnf": "root ::= ("}, "sampling_params.ebnf", "invalid EBNF"),
    ({"ebnf": 'root ::= "a" undefined'}, "sampling_params.ebnf", "invalid EBNF"),
    ({"ebnf": 'start ::= "a"'}, "sampling_params.ebnf", "invalid EBNF"),
])
def test_bad_grammars_are_400_naming_the_field(engine: Engine, sp: dict, field: str, words: str) -> None:
    for _ in range(2):  # the second time the failure comes from the cache
        resp = engine.post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, **sp}})
        assert resp.status_code == 400, resp.text
        message = resp.json()["error"]["message"]
        assert message.startswith(field + ":") and words in message, message
    batch = engine.post("/generate", {"input_ids": [PROMPT, PROMPT], "sampling_params": [{}, sp]})
    assert batch.status_code == 400
    assert batch.json()["error"]["message"].startswith(field.replace("sampling_params", "sampling_params[1]"))
    assert engine.get("/health_generate").status_code == 200


def test_mixed_batch_runs_concurrently_and_leaves_free_rows_alone(engine: Engine) -> None:
    free = {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True}
    alone = [engine.generate(input_ids=PROMPT, sampling_params={**free, "sampling_seed": s}) for s in (1, 2)]

    async def main() -> list:
        async with EngineClient(engine.url) as c:
            jobs = [c.generate(PROMPT, sampling_params={**free, "sampling_seed": s}) for s in (1, 2)]
            jobs += [c.generate([9, 8, 7], sampling_params={"regex": REGEX, "n": 4, "sampling_seed": s})
                     for s in range(4)]
            jobs += [c.generate([5], sampling_params={"json_schema": json.dumps(SCHEMA), "max_new_tokens": 64})]
            jobs += [c.generate([[1, 2], [3, 4], [5, 6]], sampling_params=[
                {"ebnf": EBNF, "max_new_tokens": 48}, {**free, "n": 1}, {"regex": REGEX}])]
            return await asyncio.gather(*jobs)

    res = asyncio.run(main())
    # a seeded unconstrained row draws the same tokens whatever constrained rows share its batch
    assert [r["output_ids"] for r in res[:2]] == [a["output_ids"] for a in alone]
    for group in res[2:6]:
        assert len(group) == 4 and all(re.fullmatch(REGEX, o["text"]) for o in group)
    obj = json.loads(res[6]["text"])
    assert obj["color"] in ("red", "green", "blue") and isinstance(obj["count"], int)
    ebnf, unconstrained, regex = res[7]
    assert re.fullmatch(EBNF_AS_REGEX, ebnf["text"]) and re.fullmatch(REGEX, regex["text"])
    assert unconstrained["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
    assert engine.get("/get_server_info").json()["internal_states"][0]["grammar_s"] > 0


def test_constrained_request_aborted_midway(engine: Engine) -> None:
    async def main() -> tuple[int, dict]:
        async with EngineClient(engine.url) as c:
            last, first_len = None, 0
            sp = {"regex": "[a-z]{3000}", "max_new_tokens": 4000}
            async for chunk in c.generate_stream([1, 2, 3], sampling_params=sp, rid="gram-abort",
                                                 return_logprob=True):
                if last is None:
                    first_len = len(chunk["output_ids"])
                    assert (await c.abort("gram-abort"))["num_aborted"] == 1
                last = chunk
            assert await c.health_generate()
            return first_len, last

    first_len, last = asyncio.run(main())
    assert first_len >= 1
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert re.fullmatch("[a-z]+", last["text"]) and len(last["text"]) < 3000
    assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])


def test_retracted_constrained_request_resumes_in_its_grammar(engine: Engine) -> None:
    async def main() -> dict:
        async with EngineClient(engine.url) as c:
            last, paused = None, False
            sp = {"regex": "[a-z]{600}", "max_new_tokens": 1000}  # hundreds of steps: still running at the pause
            async for chunk in c.generate_stream([4, 5, 6], sampling_params=sp):
                if not paused:
                    await c.pause(mode="retract")
                    await c.resume()
                    paused = True
                last = chunk
            return last

    out = asyncio.run(main())
    assert re.fullmatch("[a-z]{600}", out["text"]), out["text"]
    _check_stop(out, _eos_ids(engine.model_path))


def test_prefix_cache_stops_lengths_and_eos_rules(engine: Engine) -> None:
    eos = _eos_ids(engine.model_path)
    long_prompt = [(i * 37) % 3000 + 10 for i in range(300)]  # past the prefix cache's minimum length
    sp = {"regex": REGEX, "sampling_seed": 21}
    first = engine.generate(input_ids=long_prompt, sampling_params=sp)
    again = engine.generate(input_ids=long_prompt, sampling_params=sp)
    assert again["meta_info"]["cached_tokens"] > 0 and again["output_ids"] == first["output_ids"]
    assert re.fullmatch(REGEX, again["text"])

    stopped = engine.generate(input_ids=PROMPT, sampling_params={"regex": "[a-d]{3}e[a-z]{10}", "stop": "e", "n": 6})
    for out in stopped:
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "e"}
        assert re.fullmatch("[a-d]{3}", out["text"]), out["text"]
    short = engine.generate(input_ids=PROMPT, sampling_params={"regex": "[a-z]{200}", "max_new_tokens": 5})
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert re.fullmatch("[a-z]+", short["text"])
    # the grammar's end wins over min_new_tokens, and ends the output even with ignore_eos
    for extra in ({"min_new_tokens": 8}, {"ignore_eos": True}):
        for out in engine.generate(input_ids=PROMPT, sampling_params={"regex": "[0-9]{2}", "n": 4, **extra}):
            assert re.fullmatch("[0-9]{2}", out["text"]), out["text"]
            _check_stop(out, eos)
    kept = engine.generate(input_ids=PROMPT, sampling_params={"regex": REGEX, "no_stop_trim": True,
                                                               "skip_special_tokens": False})
    assert re.fullmatch(REGEX + r"<\|(im_end|endoftext)\|>", kept["text"]), kept["text"]


def test_grammar_cache_compiles_once(tiny: Path) -> None:
    cache = GrammarCache(lambda: load_tokenizer(tiny), 4096, _eos_ids(tiny), size=2)
    a = cache.compile(Constraint("regex", REGEX, "x.regex"))
    assert cache.compile(Constraint("regex", REGEX)) is a
    with pytest.raises(BadRequest, match=r"^y\.ebnf: invalid EBNF"):
        cache.compile(Constraint("ebnf", "nonsense", "y.ebnf"))
    cache.compile(Constraint("json_schema", "{}"))
    assert cache.compile(Constraint("regex", REGEX)) is not a  # evicted: the cache keeps the 2 most recent


def test_light_commands_never_import_the_grammar_library() -> None:
    code = ("import sys\nfrom slimecli.cli.app import app\n"
            "for argv in (['--help'], ['config', 'show']):\n"
            "    try:\n        app(argv)\n    except SystemExit as e:\n        assert not e.code, (argv, e.code)\n"
            "assert 'llguidance' not in sys.modules and 'torch' not in sys.modules\nprint('LIGHT')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "LIGHT" in out.stdout, out.stderr
