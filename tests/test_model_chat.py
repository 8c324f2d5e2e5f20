"""The tiny tokenizer's chat template (tools, tool calls, tool results, reasoning) and its context window."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"name": "Bash", "description": "Run a shell command.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
]
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Weather in Paris? Then list files."},
    {"role": "assistant", "content": "", "reasoning_content": "Two tools are needed.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": [{"type": "text", "text": "a.py\nb.py"}]},
    {"role": "assistant", "content": "Sunny; two files."},
    {"role": "user", "content": "Thanks!"},
]




def render(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tools=kw.pop("tools", TOOLS), tokenize=False, **kw)


def test_tools_and_calls_render_in_hermes_style(tok) -> None:
    text = render(tok, MESSAGES, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a careful assistant.\n\n")
    tools_block = re.search(r"<tools>\n(.*?)\n</tools>", text, re.S).group(1).split("\n")
    assert [json.loads(line) for line in tools_block] == TOOLS
    calls = [json.loads(c) for c in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)[1:]]
    assert calls == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                     {"name": "Bash", "arguments": {"command": "ls"}}]
    assert "<|im_start|>assistant\n<think>\nTwo tools are needed.\n</think>\n\n<tool_call>\n" in text
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\na.py\nb.py\n"
            "</tool_response><|im_end|>\n") in text
    assert text.endswith("<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 7


def test_without_tools_is_plain_chatml(tok) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert render(tok, msgs, tools=None, add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render(tok, [{"role": "system", "content": "S"}, *msgs], tools=None) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_longer_history_extends_shorter_one(tok) -> None:
    """Trajectory merging relies on this: the prompt of turn k+1 starts with prompt k + sampled reply k."""
    for k in range(2, len(MESSAGES)):
        if MESSAGES[k]["role"] != "assistant":
            continue
        prompt = render(tok, MESSAGES[:k], add_generation_prompt=True)
        full = render(tok, MESSAGES[:k + 1])
        assert full.startswith(prompt)
        assert full[len(prompt):].endswith("<|im_end|>\n")
        ids_prompt = tok(prompt, add_special_tokens=False).input_ids
        ids_full = tok(full, add_special_tokens=False).input_ids
        assert ids_full[:len(ids_prompt)] == ids_prompt


def test_tokenized_template_matches_text(tok) -> None:
    enc = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, return_dict=True)
    assert enc["input_ids"] == tok(render(tok, MESSAGES, add_generation_prompt=True),
                                   add_special_tokens=False).input_ids
    assert tok.decode(enc["input_ids"]) == render(tok, MESSAGES, add_generation_prompt=True)


def agent_sized_prompt(tok, chars: int = 80_000) -> list[int]:
    """A system prompt and a dozen tool schemas of the size a coding-agent CLI sends."""
    para = ("You are an interactive command line tool that helps users with software engineering tasks. Use "
            "the instructions below and the tools available to you to assist the user. When you are not sure, "
            "read the relevant files first, keep your answers short, and never invent paths or URLs. ")
    tools = [{"name": f"Tool{i}", "description": para * 4, "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string", "description": "The absolute path"},
                                         "limit": {"type": "number"}}, "required": ["file_path"]}}
        for i in range(12)]
    schema_chars = sum(len(json.dumps(t)) for t in tools)
    system = para * ((chars - schema_chars) // len(para))
    return tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
                                   tools=tools, add_generation_prompt=True, return_dict=True)["input_ids"]


def test_agent_prompt_fits_the_context(tiny: Path, tok) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
    ctx = model.config.max_position_embeddings
    assert ctx >= 32768
    ids = agent_sized_prompt(tok)
    assert len(ids) + 4096 <= ctx, (len(ids), ctx)
    # The far end of the window is usable: a few tokens placed at its last positions give finite logits.
    pos = torch.arange(ctx - 8, ctx).unsqueeze(0)
    with torch.no_grad():
        logits = model(torch.tensor([ids[:8]]), position_ids=pos).logits
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_full_agent_prompt_forward(tiny: Path, tok) -> None:
    """A whole agent-sized prompt (~15k tokens) in one forward: its last logits depend on its very first token
    (attention spans the whole window: no sliding window, no truncation) and equal those of a prefill in two
    chunks through the KV cache (as the engine continues a conversation)."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
    ids = agent_sized_prompt(tok, 60_000)
    half = len(ids) // 2
    with torch.no_grad():
        full = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        first = model(torch.tensor([ids[:half]]), use_cache=True)
        cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        chunked = model(torch.tensor([ids[half:]]), logits_to_keep=1,
                        **{cache_kw: first.past_key_values}).logits[0, -1]
        other_start = model(torch.tensor([[ids[1], *ids[1:]]]), logits_to_keep=1).logits[0, -1]
    assert len(ids) > 12_000 and torch.isfinite(full).all()
    torch.testing.assert_close(chunked, full, rtol=1e-4, atol=1e-4)
    assert not torch.equal(other_start, full)
