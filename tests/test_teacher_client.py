"""TeacherClient against an SGLang-shaped loopback server, retries, and the tokenizer compatibility check."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from slimecli.config.groups.teacher import TeacherConfig
from slimecli.rollout.sample import Sample
from slimecli.teacher.client import TeacherClient, TeacherError, check_tokenizers_compatible
from tests.helpers import free_port


def fake_logp(position: int, token: int) -> float:
    return -0.01 * (position + 1) - 0.001 * token


async def _sglang_app(seen: list[dict], fail_first: int) -> web.Application:
    """SGLang /generate with max_new_tokens 0: input_token_logprobs from logprob_start_len, None at position 0."""
    failures = {"left": fail_first}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if failures["left"]:
            failures["left"] -= 1
            return web.json_response({"error": {"message": "busy"}}, status=503)
        ids, start = body["input_ids"], body["logprob_start_len"]
        entries = [[None if p == 0 else fake_logp(p, ids[p]), ids[p], None] for p in range(max(start, 0), len(ids))]
        return web.json_response({"text": "", "output_ids": [], "meta_info": {
            "id": "x", "finish_reason": {"type": "length", "length": 0}, "prompt_tokens": len(ids),
            "completion_tokens": 0, "input_token_logprobs": entries}})

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


def test_sglang_teacher_reads_input_token_logprobs_and_retries():
    seen: list[dict] = []

    async def run():
        runner = web.AppRunner(await _sglang_app(seen, fail_first=1))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            cfg = TeacherConfig(name="sglang", url=f"http://127.0.0.1:{port}", temperature=1.0, max_retries=2)
            async with TeacherClient(cfg, backoff_s=0.01) as client:
                return await client.score([Sample(tokens=[4, 8, 15, 16, 23], response_length=2),
                                           Sample(tokens=[42, 7], response_length=1)])
        finally:
            await runner.cleanup()

    out = asyncio.run(run())
    assert out[0] == pytest.approx([fake_logp(3, 16), fake_logp(4, 23)])
    assert out[1] == pytest.approx([fake_logp(1, 7)])
    last = seen[-1]
    assert last["sampling_params"]["max_new_tokens"] == 0 and last["sampling_params"]["temperature"] == 1.0
    assert last["return_logprob"] is True and isinstance(last["logprob_start_len"], int)
    assert len(seen) == 3  # one 503, retried


def test_unreachable_teacher_fails_after_retries():
    cfg = TeacherConfig(name="server", url=f"http://127.0.0.1:{free_port()}", max_retries=2)

    async def run():
        async with TeacherClient(cfg, backoff_s=0.01) as client:
            await client.score([Sample(tokens=[1, 2, 3], response_length=1)])

    with pytest.raises(TeacherError, match="3 attempt"):
        asyncio.run(run())


def _word_tokenizer(path, words: list[str]) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(path))
    return str(path)


def test_tokenizer_compatibility(tmp_path):
    words = ["Teacher", "and", "student", "must", "agree", "12", "+", "30", "=", "42"]
    a = _word_tokenizer(tmp_path / "a", words)
    b = _word_tokenizer(tmp_path / "b", words)
    fewer = _word_tokenizer(tmp_path / "fewer", words[:-1])
    swapped = _word_tokenizer(tmp_path / "swapped", [words[1], words[0], *words[2:]])
    assert check_tokenizers_compatible(a, b) is None
    msg = check_tokenizers_compatible(a, fewer)
    assert msg and a in msg and fewer in msg and "tokens" in msg
    msg = check_tokenizers_compatible(a, swapped)
    assert msg and a in msg and swapped in msg and "probe" in msg
    msg = check_tokenizers_compatible(a, tmp_path / "missing")
    assert msg and str(tmp_path / "missing") in msg
    # the same files byte for byte: known compatible without loading them; any other pair is loaded and compared
    from slimecli.model.loading import same_tokenizer_files

    assert same_tokenizer_files(a, b) and not same_tokenizer_files(a, swapped)
    config = Path(b) / "tokenizer_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()), indent=4))  # other bytes, the same tokenizer
    assert not same_tokenizer_files(a, b) and check_tokenizers_compatible(a, b) is None


def test_client_refuses_teacher_none():
    with pytest.raises(ValueError, match="teacher=none"):
        TeacherClient(TeacherConfig())


def test_sglang_teacher_refuses_another_temperature():
    """SGLang's input-token log-probs ignore the request's temperature: scores at 0.7 would silently be at 1."""
    cfg = TeacherConfig(name="sglang", url=f"http://127.0.0.1:{free_port()}", temperature=0.7)
    with pytest.raises(ValueError, match="temperature 1 only"):
        TeacherClient(cfg)
