"""agent.constrain: grammar-constrained turns through the Anthropic and Responses adapters, against the REAL
embedded engine with the random tiny model at T=1.

Unconstrained, the random model never writes a tool call; constrained, every turn must parse (plain text, or
calls whose arguments validate against the tool's schema), honour tool_choice, and still record tokens and
log-probs that line up with what the client was sent.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from slimecli.agent.api.adapter import AdapterSettings
from slimecli.agent.api.anthropic import AnthropicAdapter
from slimecli.agent.api.anthropic import tool_choice as anthropic_choice
from slimecli.agent.api.engine_link import EngineLink
from slimecli.agent.api.render import Renderer, tool_schema
from slimecli.agent.api.responses import ResponsesAdapter
from slimecli.agent.api.responses import tool_choice as responses_choice
from slimecli.agent.trajectory.manager import TrajectoryManager
from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.groups.agent import AgentConfig
from slimecli.model import tool_grammar as constrain
from slimecli.model.tool_calls import HermesToolParser, ParsedOutput
from slimecli.model.tool_grammar import GrammarError, ToolChoice
from slimecli.rollout.sample import Sample
from tests.helpers import run_cli
from tests.helpers.engine import Engine

N = 12  # turns per case: the random model leaks out of a broken grammar within a few
# The random model chains another parallel call about one time in three, and a call takes ~60 tokens: 256 tokens
# cut one turn in a hundred mid-call (ill-formed by design); this budget makes a cut turn one in ~10^8.
CALLS_BUDGET = 1024
BASH = {"name": "Bash", "description": "Run a shell command.", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"},
                                     "timeout": {"type": "integer", "minimum": 1, "maximum": 600}},
    "required": ["command"], "additionalProperties": False}}
EDIT = {"name": "Edit", "description": "Edit a file.", "input_schema": {
    "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
    "properties": {"file_path": {"type": "string"}, "mode": {"type": "string", "enum": ["replace", "append"]},
                   "replace_all": {"type": "boolean"},
                   "lines": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                             "maxItems": 3}},
    "required": ["file_path", "mode"], "additionalProperties": False}}
TOOLS = [BASH, EDIT]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
FN_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
            for t in TOOLS]
CHOICES = [{"name": "Bash", "arguments": {"command": "printf ok > out.txt"}}, "The answer is 42.",
           "I cannot do that."]


# --- helpers --------------------------------------------------------------------------------------------

def validates(value: Any, schema: dict) -> bool:
    """The JSON-schema subset the test tools use."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "object":
        props = schema.get("properties", {})
        return isinstance(value, dict) and all(k in value for k in schema.get("required", [])) and \
            (schema.get("additionalProperties", True) is not False or set(value) <= set(props)) and \
            all(validates(v, props[k]) for k, v in value.items() if k in props)
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", math.inf)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and \
            schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and len(value) <= schema.get("maxItems", math.inf) and \
            all(validates(v, schema["items"]) for v in value)
    raise AssertionError(f"schema kind {kind!r} not covered by the test validator")


class Stack:
    """One adapter on a loopback port in front of the real engine."""

    def __init__(self, eng: Engine, adapter_cls: type, **settings: Any) -> None:
        from transformers import AutoTokenizer

        self.renderer = Renderer(AutoTokenizer.from_pretrained(str(eng.model_path)), 8192)
        self.manager = TrajectoryManager(self.renderer.stop_ids, self.renderer.decode_all, max_turns=1000)
        self.link = EngineLink(eng.url)
        self.adapter = adapter_cls(self.renderer, self.link, self.manager, HermesToolParser(),
                                   AdapterSettings(AgentConfig(**{"max_new_tokens": 256, **settings})))

    async def __aenter__(self) -> Stack:
        self.runner = web.AppRunner(self.adapter.app(), access_log=None, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.close()
        await self.link.close()
        await self.runner.cleanup()

    async def post(self, path: str, body: dict, sid: str = "s") -> tuple[int, dict]:
        async with self.http.post(self.url + path, json=body, headers={"x-api-key": sid}) as r:
            return r.status, await r.json()

    async def samples(self, sid: str) -> list[Sample]:
        return await self.manager.finish_session(sid, Sample(prompt="p"), 0.0)


def anthropic_body(tool_choice: dict | None = None, messages: list | None = None, **kw: Any) -> dict:
    body = {"model": "m", "max_tokens": 256, "tools": TOOLS, "system": "You edit code.",
            "messages": messages or [{"role": "user", "content": "fix the bug"}], **kw}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return body


def responses_body(tool_choice: Any = None, **kw: Any) -> dict:
    body = {"model": "m", "input": "fix the bug", "instructions": "You edit code.", "tools": FN_TOOLS, **kw}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return body


def anthropic_calls(reply: dict) -> list[tuple[str, dict]]:
    return [(b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"]


def responses_calls(reply: dict) -> list[tuple[str, dict]]:
    return [(o["name"], json.loads(o["arguments"])) for o in reply["output"] if o["type"] == "function_call"]


def check_calls(calls: list[tuple[str, dict]], names: set[str]) -> None:
    assert calls
    for name, args in calls:
        assert name in names and validates(args, SCHEMAS[name]), (name, args)


def check_recorded(samples: list[Sample]) -> None:
    """The sample's tokens, mask and log-probs line up; the sampled tokens decode to what the parser saw."""
    [s] = samples
    assert len(s.tokens) == s.prompt_length + s.response_length
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 0
    sampled = [lp for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if m]
    assert sampled and all(math.isfinite(lp) and lp <= 0.0 for lp in sampled)
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if not m)
    assert s.metadata["ill_formed_turns"] == 0


def budget(case: str) -> int:
    """Turns that may be text stop at 256 tokens (the random model seldom ends text); calls get CALLS_BUDGET."""
    return 256 if case in ("none", "auto") else CALLS_BUDGET


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- tool_calls against the real engine --------------------------------------------------------------------

def test_anthropic_tool_calls_every_turn_parses_and_honours_tool_choice(engine: Engine) -> None:
    async def main() -> None:
        async with Stack(engine, AnthropicAdapter, constrain="tool_calls", constrain_max_string_len=12,
                         max_new_tokens=CALLS_BUDGET) as st:
            cases = [("any", {"type": "any"}), ("named", {"type": "tool", "name": "Edit"}),
                     ("single", {"type": "any", "disable_parallel_tool_use": True}), ("none", {"type": "none"}),
                     ("auto", None)]
            jobs = [(case, i, st.post("/v1/messages", anthropic_body(choice, max_tokens=budget(case)),
                                      sid=f"{case}-{i}"))
                    for case, choice in cases for i in range(N)]
            replies = await asyncio.gather(*(job for _, _, job in jobs))
            for (case, i, _), (status, reply) in zip(jobs, replies, strict=True):
                assert status == 200, reply
                calls = anthropic_calls(reply)
                if case in ("any", "named", "single"):
                    check_calls(calls, {"Edit"} if case == "named" else {"Bash", "Edit"})
                    assert reply["stop_reason"] == "tool_use", reply
                    if case == "single":
                        assert len(calls) == 1
                else:  # text; auto could call a tool, which must then be well-formed
                    if calls:
                        check_calls(calls, {"Bash", "Edit"})
                    else:
                        [block] = reply["content"]
                        assert block["type"] == "text" and "<tool_call>" not in block["text"]
                check_recorded(await st.samples(f"{case}-{i}"))
            names = {n for (case, _, _), (_, r) in zip(jobs, replies, strict=True) if case == "any"
                     for n, _ in anthropic_calls(r)}
            assert names == {"Bash", "Edit"}  # sampled among the tools, not forced into one
    run(main())


def test_responses_tool_calls_every_turn_parses_and_honours_tool_choice(engine: Engine) -> None:
    async def main() -> None:
        async with Stack(engine, ResponsesAdapter, constrain="tool_calls", constrain_max_string_len=12,
                         max_new_tokens=CALLS_BUDGET) as st:
            cases = [("required", "required", {}), ("named", {"type": "function", "name": "Bash"}, {}),
                     ("single", "required", {"parallel_tool_calls": False}), ("none", "none", {}),
                     ("allowed", {"type": "allowed_tools", "mode": "required",
                                  "tools": [{"type": "function", "name": "Edit"}]}, {}), ("auto", None, {})]
            jobs = [(case, i, st.post("/v1/responses", responses_body(choice, max_output_tokens=budget(case), **kw),
                                      sid=f"{case}-{i}"))
                    for case, choice, kw in cases for i in range(N)]
            replies = await asyncio.gather(*(job for _, _, job in jobs))
            for (case, i, _), (status, reply) in zip(jobs, replies, strict=True):
                assert status == 200, reply
                calls = responses_calls(reply)
                want = {"named": {"Bash"}, "allowed": {"Edit"}}.get(case, {"Bash", "Edit"})
                if case in ("required", "named", "single", "allowed"):
                    check_calls(calls, want)
                    assert reply["incomplete_details"] is None
                    if case == "single":
                        assert len(calls) == 1
                elif calls:
                    check_calls(calls, want)
                else:
                    [msg] = reply["output"]
                    assert msg["type"] == "message" and "<tool_call>" not in msg["content"][0]["text"]
                check_recorded(await st.samples(f"{case}-{i}"))
    run(main())


def test_tool_call_turn_round_trips_into_the_next_prompt(engine: Engine) -> None:
    """The sampled call (markers as their added tokens, compact JSON) is what the template renders back, up to
    the BPE split of the JSON: the next turn extends the same branch (realigned at most), it does not fork."""
    async def main() -> None:
        async with Stack(engine, AnthropicAdapter, constrain="tool_calls", constrain_max_string_len=8) as st:
            msgs: list = [{"role": "user", "content": "go"}]
            status, reply = await st.post("/v1/messages", anthropic_body({"type": "tool", "name": "Bash",
                                                                          "disable_parallel_tool_use": True}, msgs))
            assert status == 200 and reply["stop_reason"] == "tool_use", reply
            [use] = [b for b in reply["content"] if b["type"] == "tool_use"]
            msgs += [{"role": "assistant", "content": reply["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}]}]
            status, reply = await st.post("/v1/messages", anthropic_body({"type": "none"}, msgs, max_tokens=8))
            assert status == 200 and not anthropic_calls(reply)
            [s] = await st.samples("s")
            assert (s.metadata["turns"], s.metadata["num_branches"]) == (2, 1) and s.metadata["realigned"] <= 1
            check_recorded([s])
            tok = st.renderer.tokenizer
            response = s.tokens[s.prompt_length:]
            first = response[:next(i for i, t in enumerate(response) if t in st.renderer.stop_ids) + 1]
            # the grammar forced the markers (tool_choice names the tool): not the policy's choice, not trained
            assert s.loss_mask[0] == 0 and 1 in s.loss_mask[:len(first)]
            assert first[0] == tok.convert_tokens_to_ids("<tool_call>")  # the marker as its single added token
            assert first[-2] == tok.convert_tokens_to_ids("</tool_call>") and first[-1] in st.renderer.stop_ids
            assert st.renderer.decode(first) == HermesToolParser.call_format.format_call("Bash", use["input"])
    run(main())


def test_uncompilable_tool_schemas_are_400_in_the_clients_format(engine: Engine) -> None:
    bad = {"name": "Bad", "input_schema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}

    async def main() -> None:
        async with Stack(engine, AnthropicAdapter, constrain="tool_calls") as st:
            status, reply = await st.post("/v1/messages", anthropic_body({"type": "any"}, tools=[BASH, bad]))
            assert status == 400 and reply["type"] == "error", reply
            assert reply["error"]["type"] == "invalid_request_error" and "missing" in reply["error"]["message"]
            for body in (anthropic_body({"type": "tool", "name": "Nope"}), anthropic_body({"type": "any"}, tools=[]),
                         anthropic_body(tools=[{"name": "S", "input_schema": {"type": "string"}}])):
                status, reply = await st.post("/v1/messages", body)
                assert status == 400 and reply["error"]["type"] == "invalid_request_error", reply
            status, reply = await st.post("/v1/messages", anthropic_body({"type": "whatever"}))
            assert status == 400 and "tool_choice" in reply["error"]["message"]
            assert await st.samples("s") == []  # nothing recorded
        async with Stack(engine, ResponsesAdapter, constrain="tool_calls") as st:
            fn_bad = {"type": "function", "name": "Bad", "parameters": bad["input_schema"]}
            status, reply = await st.post("/v1/responses", responses_body("required", tools=[fn_bad]))
            assert status == 400 and reply["error"]["type"] == "invalid_request_error", reply
            assert "missing" in reply["error"]["message"]
            status, reply = await st.post("/v1/responses", responses_body({"type": "web_search_preview"}))
            assert status == 400 and "not offered" in reply["error"]["message"], reply
    run(main())


# --- choices ---------------------------------------------------------------------------------------------

def test_choices_always_yield_exactly_one_then_the_final_text(engine: Engine) -> None:
    async def main() -> None:
        async with Stack(engine, AnthropicAdapter, constrain="choices") as st:
            fmt = HermesToolParser.call_format
            texts = {fmt.format_call(c["name"], c["arguments"]) if isinstance(c, dict) else c for c in CHOICES}
            sids = [f"c-{i}" for i in range(2 * N)]
            for sid in sids:
                st.adapter.set_choices(sid, CHOICES)
            replies = await asyncio.gather(*(st.post("/v1/messages", anthropic_body(), sid=sid) for sid in sids))
            seen = []
            for sid, (status, reply) in zip(sids, replies, strict=True):
                assert status == 200, reply
                calls = anthropic_calls(reply)
                if calls:
                    assert calls == [("Bash", {"command": "printf ok > out.txt"})] and len(reply["content"]) == 1
                    seen.append("call")
                    msgs = [{"role": "user", "content": "fix the bug"},
                            {"role": "assistant", "content": reply["content"]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply["content"][0]["id"],
                                                          "content": "done"}]}]
                    status, final = await st.post("/v1/messages", anthropic_body(messages=msgs), sid=sid)
                    assert status == 200 and final["content"] == [{"type": "text", "text": "Done."}], final
                    assert final["stop_reason"] == "end_turn"
                else:
                    [block] = reply["content"]
                    assert block["text"] in texts and reply["stop_reason"] == "end_turn", reply
                    seen.append(block["text"])
                [s] = await st.samples(sid)
                check_recorded([s])
                assert s.metadata["num_branches"] == 1 and s.metadata["turns"] == (2 if calls else 1)
            assert len(set(seen)) >= 2  # sampled among the alternatives
            st.adapter.set_choices("after", CHOICES)  # a tool already ran: the turn is the final text
            msgs = [{"role": "user", "content": "go"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                       "input": {"command": "printf ok > out.txt"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
            status, final = await st.post("/v1/messages", anthropic_body(messages=msgs), sid="after")
            assert status == 200 and final["content"] == [{"type": "text", "text": "Done."}], final
            status, reply = await st.post("/v1/messages", anthropic_body(), sid="unregistered")
            assert status == 400 and "no choices" in reply["error"]["message"]
    run(main())


def test_choices_file_and_choices_then_for_responses(engine: Engine, tmp_path) -> None:
    path = tmp_path / "choices.json"
    path.write_text(json.dumps(CHOICES))

    async def main() -> None:
        async with Stack(engine, ResponsesAdapter, constrain="choices", choices_file=str(path),
                         choices_then="tool_calls", constrain_max_string_len=8) as st:
            status, reply = await st.post("/v1/responses", responses_body())
            assert status == 200
            out = reply["output"]
            got = responses_calls(reply) or [o["content"][0]["text"] for o in out]
            assert got in ([("Bash", {"command": "printf ok > out.txt"})], [CHOICES[1]], [CHOICES[2]]), got
            after = responses_body("required", input=[
                {"type": "message", "role": "user", "content": "go"},
                {"type": "function_call", "name": "Bash", "call_id": "c1", "arguments": '{"command": "ls"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}])
            status, reply = await st.post("/v1/responses", after, sid="other")  # file choices: any session
            assert status == 200
            check_calls(responses_calls(reply), {"Bash", "Edit"})  # choices_then=tool_calls
    run(main())


# --- units -----------------------------------------------------------------------------------------------

def test_grammar_building_units() -> None:
    tokens = {"<tool_call>": 7, "</tool_call>": 8}
    assert constrain.literal('a<tool_call>\n"x"</tool_call>', tokens) == '"a" <[7]> "\\n\\"x\\"" <[8]>'
    assert constrain.literal("", tokens) == '""'
    capped = constrain.cap_strings({"type": "object", "properties": {
        "enum": {"type": "string"}, "p": {"type": "string", "pattern": "a+"}, "l": {"type": "string", "minLength": 9},
        "e": {"type": "string", "enum": ["x"]}, "a": {"type": "array", "items": {"type": ["string", "null"]}}},
        "default": {"type": "string"}}, 4)
    props = capped["properties"]
    assert props["enum"]["maxLength"] == 4 and "maxLength" not in props["p"] and props["l"]["maxLength"] == 9
    assert "maxLength" not in props["e"] and props["a"]["items"]["maxLength"] == 4
    assert capped["default"] == {"type": "string"}
    assert constrain.arguments_schema(None, "t")["type"] == "object"
    assert constrain.arguments_schema({"properties": {}}, "t")["type"] == "object"
    fmt = HermesToolParser.call_format
    tools = [tool_schema("A", "", {"type": "object"})]
    with pytest.raises(GrammarError, match="must describe an object"):
        constrain.tool_call_grammar([tool_schema("A", "", {"type": "array"})], ToolChoice(), fmt, tokens)
    with pytest.raises(GrammarError, match="not offered"):
        constrain.tool_call_grammar(tools, ToolChoice("required", ("B",)), fmt, tokens)
    with pytest.raises(GrammarError, match="offers no tools"):
        constrain.tool_call_grammar([], ToolChoice("required"), fmt, tokens)
    assert constrain.tool_call_grammar([], ToolChoice(), fmt, tokens).startswith("start: TEXT\n")
    single = constrain.tool_call_grammar(tools, ToolChoice("required", parallel=False), fmt, tokens)
    assert "calls: call\n" in single and single.startswith("start: calls\n")
    assert constrain.resolve_choices(["x", {"name": "A", "arguments": {"k": 1}}], fmt) == (
        "x", '<tool_call>\n{"name": "A", "arguments": {"k": 1}}\n</tool_call>')
    for bad in ([], "x", [""], [{"name": ""}], [{"name": "A", "arguments": []}], [3]):
        with pytest.raises(GrammarError):
            constrain.resolve_choices(bad, fmt)
    parsed = HermesToolParser().parse(fmt.format_call("A", {"k": [1, "é"]}))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("A", {"k": [1, "é"]})] and not parsed.ill_formed


def test_tool_choice_parsing() -> None:
    from slimecli.agent.api.adapter import ApiError

    assert anthropic_choice(None) == ToolChoice()
    assert anthropic_choice({"type": "any"}) == ToolChoice("required")
    assert anthropic_choice({"type": "tool", "name": "X", "disable_parallel_tool_use": True}) == \
        ToolChoice("required", ("X",), False)
    assert anthropic_choice({"type": "none"}) == ToolChoice("none")
    for bad in ("any", {"type": "tool"}, {"type": "auto", "disable_parallel_tool_use": "yes"}):
        with pytest.raises(ApiError):
            anthropic_choice(bad)
    assert responses_choice("required", parallel=False) == ToolChoice("required", None, False)
    assert responses_choice({"type": "function", "name": "f"}) == ToolChoice("required", ("f",))
    assert responses_choice({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}
                            ) == ToolChoice("auto", ("f",))
    for bad in ("sometimes", {"type": "function"}, {"type": "allowed_tools", "mode": "x", "tools": []}):
        with pytest.raises(ApiError):
            responses_choice(bad)


def test_adapter_refuses_settings_that_cannot_work(tmp_path) -> None:
    from transformers import AutoTokenizer

    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    renderer = Renderer(AutoTokenizer.from_pretrained(str(resolve_model_path(ModelConfig()))), 4096)
    manager = TrajectoryManager(renderer.stop_ids, renderer.decode_all)

    class PlainParser:
        def parse(self, text: str) -> ParsedOutput:
            return ParsedOutput(text=text)

    def make(parser: Any = None, **kw: Any) -> AnthropicAdapter:
        return AnthropicAdapter(renderer, EngineLink("http://127.0.0.1:1"), manager, parser or HermesToolParser(),
                                AdapterSettings(AgentConfig(**kw)))

    with pytest.raises(ValueError, match="call_format"):
        make(PlainParser(), constrain="tool_calls")
    with pytest.raises(ValueError, match="choices file"):
        make(constrain="choices", choices_file=str(tmp_path / "missing.json"))
    make(PlainParser(), constrain="choices", choices_then="none")  # text choices need no call format
    adapter = make(constrain="choices")
    adapter.set_choices("a", ["x"])
    manager.drop_session("a")
    adapter.set_choices("b", ["y"])  # forgets the closed session's choices
    assert set(adapter._choices) == {"b"}


def test_config_rules() -> None:
    cfg = load(["agent.constrain=choices", "agent.choices_then=none", "agent.constrain_max_string_len=32"])
    assert (cfg.agent.constrain, cfg.agent.choices_then, cfg.agent.constrain_max_string_len) == ("choices", "none", 32)
    cases = {"agent.constrain=choice": "did you mean 'choices'?",
             "agent.choices_then=finale": "did you mean 'final'?",
             "agent.constrain_max_string_len=0": "must be > 0",
             "agent.choices_file=c.json": "only used with agent.constrain=choices"}
    for override, expected in cases.items():
        with pytest.raises(ConfigErrors) as info:
            load([override])
        [error] = info.value.errors
        assert error.path == override.split("=")[0] and expected in error.render(), error.render()
    with pytest.raises(ConfigErrors) as info:
        load(["agent.constrain=choices", "agent.choices_final="])
    assert [e.path for e in info.value.errors] == ["agent.choices_final"]


# --- the real Claude Code CLI ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.agent_cli
def test_real_claude_code_runs_the_one_listed_bash_call_then_stops(tmp_path) -> None:
    """The random model, constrained to a single choice (one Bash call), makes Claude Code run the command in
    its workspace; the turn after the tool result is the final text, so the CLI ends its run."""
    from slimecli.agent.harness.install import locate
    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    if locate("claude_code") is None:
        pytest.skip("the claude_code CLI is not installed: run `slimecli agent install claude_code`")
    ws, out, choices = tmp_path / "ws", tmp_path / "samples.jsonl", tmp_path / "choices.json"
    ws.mkdir()
    command = "printf 'written by the chosen edit' > chosen.txt"
    choices.write_text(json.dumps([{"name": "Bash", "arguments": {"command": command,
                                                                  "description": "Write chosen.txt"}}]))
    proc = run_cli("agent", "run", "agent=claude_code", f"model.path={resolve_model_path(ModelConfig())}",
                   "task.prompt=Write chosen.txt", f"task.workdir={ws}", f"agent.output={out}",
                   "agent.constrain=choices", f"agent.choices_file={choices}", "agent.time_budget_s=240",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ws / "chosen.txt").read_text() == "written by the chosen edit"
    [s] = [json.loads(line) for line in out.read_text().splitlines()]
    assert s["metadata"]["exit_code"] == 0 and s["metadata"]["turns"] == 2 and s["status"] == "completed"
    assert "Done." in s["metadata"]["cli_stdout"]
    assert 0 < s["response_length"] < len(s["tokens"])
    assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == s["response_length"]
    # one choice, then the fixed final text: the grammar left only ways to split the same text into tokens, so
    # few tokens are the model's choice (they are trained) and the forced rest, with log-prob 0, is not
    trained = [m for m, lp in zip(s["loss_mask"], s["rollout_log_probs"], strict=True) if lp != 0.0]
    assert all(trained) and 0 < s["loss_mask"].count(1) == len(trained) < 0.3 * s["loss_mask"].count(0)
    assert command in s["response"] and "<tool_response>" in s["response"]  # the call, then its result as context
    assert s["metadata"]["ill_formed_turns"] == 0 and s["metadata"]["num_branches"] == 1
