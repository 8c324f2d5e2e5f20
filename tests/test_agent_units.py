"""Agent layer pieces without servers: tool-call parsing, trajectories, exit-status parsing, registry, install."""

from __future__ import annotations

import asyncio
import json

import pytest

from slimecli.agent import registry
from slimecli.agent.harness import install
from slimecli.agent.trajectory.manager import SessionClosed, TooManyTurns, TrajectoryManager, Turn
from slimecli.model.tool_calls import HermesToolParser, get_parser
from slimecli.rollout.sample import Sample, Status

STOP = 99


def call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_parser_text_reasoning_and_calls():
    p = HermesToolParser()
    out = p.parse("<think>\nplan it\n</think>\n\nI will write.\n" + call("Write", {"path": "a"}) + call("Bash", {}))
    assert out.reasoning == "plan it" and out.text == "I will write." and not out.ill_formed
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("Write", {"path": "a"}), ("Bash", {})]
    assert p.parse("just text").text == "just text"
    assert p.parse("x <tool_call>\n{\"name\": \"W\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>").tool_calls[0] \
        .arguments == {"a": 1}


@pytest.mark.parametrize("bad", [
    "<tool_call>\n{not json}\n</tool_call>",
    "<tool_call>\n{\"arguments\": {}}\n</tool_call>",              # no name
    "<tool_call>\n{\"name\": \"W\", \"arguments\": [1]}\n</tool_call>",  # arguments not an object
    "<tool_call>\n{\"name\": \"W\", \"arguments\": {}}",            # unterminated (length-cut)
    "[1]<tool_call>[1]</tool_call>",
])
def test_parser_ill_formed_is_returned_as_text(bad):
    out = HermesToolParser().parse(bad)
    assert out.ill_formed and not out.tool_calls and out.text == bad.strip()


def test_get_parser_by_name_and_import_path():
    assert isinstance(get_parser("qwen"), HermesToolParser)
    assert isinstance(get_parser("slimecli.model.tool_calls:HermesToolParser"), HermesToolParser)
    with pytest.raises(ValueError, match="valid: hermes, qwen"):
        get_parser("nope")


def manager(**kw) -> TrajectoryManager:
    return TrajectoryManager({STOP}, lambda ids: " ".join(map(str, ids)), **kw)


def finish(m: TrajectoryManager, sid: str = "s") -> list[Sample]:
    return asyncio.run(m.finish_session(sid, Sample(prompt="task", rollout_id=7), reward=1.0))


def turn(prompt, out, finish="stop"):
    return Turn(list(prompt), list(out), [-0.5] * len(out), finish)


def check_consistent(s: Sample) -> None:
    assert s.response_length == len(s.tokens) - s.prompt_length
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length


def test_clean_extension_appends_context_with_mask_zero():
    m = manager()
    for prompt, out in (([1, 2, 3], [10, 11, STOP]), ([1, 2, 3, 10, 11, STOP, 4, 5], [12, STOP])):
        m.begin_turn("s")
        m.end_turn("s", turn(prompt, out))
    [s] = finish(m)
    check_consistent(s)
    assert s.tokens == [1, 2, 3, 10, 11, STOP, 4, 5, 12, STOP] and s.prompt_length == 3
    assert s.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert s.rollout_log_probs == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert s.reward == 1.0 and s.rollout_id == 7 and s.status == Status.COMPLETED and s.metadata["turns"] == 2
    assert s.metadata["tool_calls"] == {} and s.metadata["context_truncated"] is False


def test_each_token_keeps_the_weight_version_that_sampled_it():
    import dataclasses

    m = manager()
    # turn 1 lived through a weight update (partial rollouts): its tokens split between versions 3 and 4
    first = dataclasses.replace(turn([1, 2, 3], [10, 11, STOP]), weight_version="4", token_versions=[3, 4, 4])
    second = dataclasses.replace(turn([1, 2, 3, 10, 11, STOP, 4, 5], [12, STOP]), weight_version="5")
    for t in (first, second):
        m.begin_turn("s")
        m.end_turn("s", t)
    [s] = finish(m)
    # the tool output between the turns was sampled by nobody (-1); the second turn's engine reported one version
    assert s.token_versions == [3, 4, 4, -1, -1, 5, 5] and s.weight_versions == ["4", "5"]


def test_tool_calls_and_context_limits_are_counted_per_branch():
    import dataclasses

    m = manager()
    turns = [dataclasses.replace(turn([1, 2, 3], [10, STOP]), tool_calls=("Bash", "Read")),
             dataclasses.replace(turn([1, 2, 3, 10, STOP, 4], [11, STOP]), tool_calls=("Bash",), context_limited=True)]
    for t in turns:
        m.begin_turn("s")
        m.end_turn("s", t)
    [s] = finish(m)
    assert s.metadata["tool_calls"] == {"Bash": 2, "Read": 1} and s.metadata["context_truncated"] is True


def test_tokens_a_grammar_forced_are_not_trained():
    m = manager()
    m.begin_turn("s")  # a constrained turn: the grammar left one token at 10, 12 and STOP (log-prob exactly 0)
    m.end_turn("s", Turn([1, 2], [10, 11, 12, STOP], [0.0, -1.1, 0.0, 0.0], "stop", constrained=True))
    m.begin_turn("s")  # a free turn with a certain token is still the policy's own
    m.end_turn("s", Turn([1, 2, 10, 11, 12, STOP, 4], [13, STOP], [0.0, -0.2], "stop"))
    [s] = finish(m)
    check_consistent(s)
    assert s.loss_mask == [0, 1, 0, 0, 0, 1, 1]
    assert s.rollout_log_probs == [0.0, -1.1, 0.0, 0.0, 0.0, 0.0, -0.2]


def test_small_drift_in_last_response_is_realigned_onto_sampled_tokens():
    m = manager(realign_min_ratio=0.5)
    m.begin_turn("s")
    m.end_turn("s", turn([1, 2], [10, 11, 12, STOP]))
    m.begin_turn("s")  # the client re-serialised the response: 10 11 12 came back as 10 13 12
    m.end_turn("s", turn([1, 2, 10, 13, 12, STOP, 4], [20, STOP]))
    [s] = finish(m)
    check_consistent(s)
    assert s.tokens == [1, 2, 10, 11, 12, STOP, 4, 20, STOP]
    assert s.loss_mask == [1, 1, 1, 1, 0, 1, 1] and s.metadata["realigned"] == 1


def test_divergence_forks_and_shared_response_is_trained_once():
    m = manager()
    turns = [([1, 2], [10, STOP]),                 # main agent
             ([1, 2, 10, STOP, 3], [11, STOP]),    # main agent continues: appended
             ([7, 8], [30, STOP]),                 # a sub-agent / compaction: unrelated prompt -> fork
             ([1, 2, 10, STOP, 5], [12, STOP])]    # branches after the shared response 10 -> fork, 10 is context
    for prompt, out in turns:
        m.begin_turn("s")
        m.end_turn("s", turn(prompt, out))
    samples = finish(m)
    assert len(samples) == 3
    for s in samples:
        check_consistent(s)
    trained = [t for s in samples for t, keep in zip(s.tokens[s.prompt_length:], s.loss_mask, strict=True) if keep]
    assert sorted(trained) == sorted([10, STOP, 11, STOP, 30, STOP, 12, STOP])  # every sampled token exactly once
    assert len({s.rollout_id for s in samples}) == 1 and all(s.reward == 1.0 for s in samples)


def test_finish_is_idempotent_drop_is_idempotent_and_closed_sessions_refuse():
    m = manager(max_turns=2)
    m.begin_turn("s")
    m.end_turn("s", turn([1], [2, STOP]))
    m.begin_turn("s")
    m.end_turn("s", None)  # reply never reached the client: not recorded
    with pytest.raises(TooManyTurns):
        m.begin_turn("s")
    assert len(finish(m)) == 1 and finish(m) == []
    with pytest.raises(SessionClosed):
        m.begin_turn("s")
    m.begin_turn("t")
    m.drop_session("t")
    m.drop_session("t")
    m.end_turn("t", turn([1], [2]))  # a late turn of a dropped session is ignored
    assert finish(m, "t") == [] and m.sessions() == []


def test_length_finish_is_truncated_and_unrecorded_sessions_give_nothing():
    m = manager()
    m.begin_turn("s")
    m.end_turn("s", turn([1, 2], [5, 6], finish="length"))
    [s] = finish(m)
    assert s.status == Status.TRUNCATED
    m.begin_turn("e")
    m.end_turn("e", turn([1, 2], [], finish="length"))  # at the context limit: nothing sampled
    assert finish(m, "e") == []


def test_registry_names_env_and_custom_pairs(monkeypatch):
    assert registry.resolve("claude_code")[1].__name__ == "ClaudeCodeHarness"
    assert registry.resolve("codex")[2].__name__ == "ResponsesAdapter"
    with pytest.raises(ValueError, match="valid: claude_code, codex"):
        registry.resolve("aider")
    name, h, a = registry.resolve("mine", "slimecli.agent.harness.clis:ClaudeCodeHarness",
                                  "slimecli.agent.api.responses:ResponsesAdapter")
    assert (name, h.__name__, a.__name__) == ("mine", "ClaudeCodeHarness", "ResponsesAdapter")
    with pytest.raises(ValueError, match="cannot import"):
        registry.resolve("mine", "nowhere.mod:X", "slimecli.agent.api.responses:ResponsesAdapter")


def test_install_command_is_pinned_into_the_tools_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMECLI_TOOLS_DIR", str(tmp_path))
    cmd = install.install_command("codex")
    assert cmd[:4] == ["npm", "install", "--prefix", str(tmp_path / "codex")]
    assert cmd[-1] == f"@openai/codex@{install.PACKAGES['codex'].version}"
    assert install.locate("claude_code", binary=str(tmp_path / "missing")) is None
    with pytest.raises(ValueError):
        install.install_command("aider")


class ShellHarness:
    """A harness whose 'CLI' is a shell snippet (the base class machinery is what is under test)."""

    @staticmethod
    def make(script: str):
        from slimecli.agent.harness.clis import Harness

        class _H(Harness):
            agent = "shell"

            def locate(self) -> str:
                return "/bin/sh"

            def configure(self, sandbox, base_url, session_id):
                return {"SESSION": session_id}

            def command(self, binary, prompt, sandbox):
                return [binary, "-c", script]

        return _H()


def test_harness_waits_for_the_cli_and_reports_its_exit_status_and_output(tmp_path):
    from slimecli.sandbox.local import LocalSandbox

    # A file the CLI writes cannot pose as its exit status: the status comes from the process itself.
    harness = ShellHarness.make("echo 0 > shell.status; sleep 1; echo done; exit 3")
    sandbox = LocalSandbox(tmp_path)
    try:
        result = asyncio.run(harness.run(sandbox, "p", "http://x", "sid", budget_s=60))
    finally:
        sandbox.close()
    assert result.exit_code == 3 and not result.timed_out and result.stdout == "done\n"


def test_sandbox_scrubs_env_and_kills_the_group_at_the_time_limit(tmp_path, monkeypatch):
    from slimecli.sandbox.local import LocalSandbox
    from tests.helpers import wait_dead

    monkeypatch.setenv("ANTHROPIC_API_KEY", "secret-of-the-caller")
    sandbox = LocalSandbox()
    try:
        sandbox.write_file("sub/a.txt", "content")
        assert sandbox.read_file("sub/a.txt") == "content" and sandbox.read_file("missing") is None
        res = asyncio.run(sandbox.exec(["/bin/sh", "-c", "env; cat sub/a.txt"], timeout_s=30, env={"X": "1"}))
        assert res.returncode == 0 and "secret-of-the-caller" not in res.stdout and "X=1" in res.stdout
        assert f"HOME={sandbox.home}" in res.stdout and res.stdout.endswith("content")
        script = f"trap '' TERM; sleep 300 & echo $! > {tmp_path}/child; wait"
        res = asyncio.run(sandbox.exec(["/bin/sh", "-c", script], timeout_s=1))
        assert res.timed_out and res.returncode is None
        assert wait_dead([int((tmp_path / "child").read_text())], timeout=10) == []
    finally:
        sandbox.close()


def test_agent_cli_needs_an_agent_and_a_prompt(monkeypatch):
    from tests.helpers import invoke_cli

    monkeypatch.delenv("SWE_AGENT", raising=False)
    proc = invoke_cli("agent", "run", "task.prompt=x")
    assert proc.returncode == 2 and "no agent chosen" in proc.stderr
    proc = invoke_cli("agent", "run", "agent=codex")
    assert proc.returncode == 2 and "task.prompt" in proc.stderr
    proc = invoke_cli("agent", "install", "aider", "--print")
    assert proc.returncode == 2 and "valid: claude_code, codex" in proc.stderr


@pytest.mark.parametrize("overrides,key,words", [
    (["agent.name=mine"], "agent.name", "unknown agent; valid: claude_code, codex"),
    (["agent.harness=a.b:H"], "agent.adapter", "needs both agent.harness and agent.adapter"),
    (["agent.tool_parser=xml"], "agent.tool_parser", "must be qwen or hermes"),
    (["agent.max_new_tokens=0"], "agent.max_new_tokens", "must be > 0"),
    (["agent.realign_min_ratio=1.5"], "agent.realign_min_ratio", "must be in [0, 1]"),
    (["agent.engine_url=localhost:1"], "agent.engine_url", "must start with http://"),
    (["agent.port=70000"], "agent.port", "must be a TCP port"),
])
def test_agent_config_rules(overrides, key, words):
    from slimecli.config.compose import load
    from slimecli.config.errors import ConfigErrors

    with pytest.raises(ConfigErrors) as info:
        load(overrides)
    assert key in info.value.render() and words in info.value.render()
    assert load(["agent.name=mine", "agent.harness=a.b:H", "agent.adapter=a.b:A"]).agent.name == "mine"


def test_locate_skips_the_claude_placeholder_when_npm_skipped_install_scripts(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMECLI_TOOLS_DIR", str(tmp_path))
    modules = tmp_path / "claude_code" / "node_modules"
    stub = modules / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
    native = modules / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    for f, size in ((stub, 100), (native, 2 << 20)):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"\0" * size)
        f.chmod(0o755)
    (modules / ".bin").mkdir()
    (modules / ".bin" / "claude").symlink_to(stub)
    assert install.locate("claude_code") == str(native)
    native.unlink()
    stub.write_bytes(b"\0" * (2 << 20))  # the postinstall replaced the placeholder: use the launcher
    assert install.locate("claude_code") == str(modules / ".bin" / "claude")


def test_engine_pool_keeps_each_session_on_one_engine_and_balances_new_ones():
    import asyncio

    from slimecli.agent.api.engine_link import EnginePool

    pool = EnginePool(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    served: list[tuple[str, str]] = []
    for i, link in enumerate(pool.links):
        async def generate(ids, params, rid=None, i=i):
            served.append((str(i), rid))
            return None
        link.generate = generate  # type: ignore[method-assign]

    async def turns():
        for sid, rid in [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("b", "5")]:
            await pool.generate([1], {}, rid=rid, session=sid)

    asyncio.run(turns())
    assert served == [("0", "1"), ("1", "2"), ("0", "3"), ("0", "4"), ("1", "5")]
    pool.release("a")
    pool.release("c")  # engine 0 is now free: the next new session goes there
    assert pool.engine_of("d") == 0 and pool.engine_of("b") == 1 and pool.assigned("b") == 1
    assert pool.assigned("e") is None  # asking does not assign
    pool.release("never-seen")  # harmless
    asyncio.run(pool.close())


def test_the_cli_dials_the_advertised_host_of_a_wildcard_bind():
    from slimecli.agent.api.service import dial_url

    assert dial_url("127.0.0.1", 8001) == "http://127.0.0.1:8001"
    assert dial_url("0.0.0.0", 8001) == "http://127.0.0.1:8001"  # a wildcard is not an address to dial
    assert dial_url("0.0.0.0", 8001, "trainer-0.cluster") == "http://trainer-0.cluster:8001"
    assert dial_url("::", 8001, "fd00::5") == "http://[fd00::5]:8001"


def test_both_adapters_read_tools_alike_and_offer_only_their_client_tools():
    """The one `tools` reader: what each API offers the local model, the schema under its own key, 400s by index."""
    from slimecli.agent.api import anthropic, responses
    from slimecli.agent.api.fields import ApiError, tools_of

    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    claude = [{"name": "Write", "input_schema": schema}, {"type": "web_search_20250305", "name": "web_search"},
              {"name": "Later", "defer_loading": True}, {"type": "custom", "name": "Bash", "description": 7}]
    assert [(t["function"]["name"], t["function"]["parameters"], t["function"]["description"])
            for t in tools_of(claude, anthropic._offered, "input_schema")] == [
        ("Write", schema, ""), ("Bash", {"type": "object", "properties": {}}, "")]
    codex = [{"type": "function", "name": "shell", "description": "run", "parameters": schema},
             {"type": "local_shell"}, {"type": "custom", "name": "apply_patch"}]
    assert [t["function"]["name"] for t in tools_of(codex, responses._function, "parameters")] == ["shell"]
    for raw, message in [({"name": "x"}, "`tools` must be a list"), ([{"name": "a"}, "b"], "tools.1 must be an object"),
                         ([{"type": "function"}], "tools.0: a tool needs a string `name`")]:
        with pytest.raises(ApiError, match=message) as info:
            tools_of(raw, responses._function, "parameters")
        assert info.value.status == 400


def test_the_engine_wait_looks_soon_then_every_tenth_of_a_second(monkeypatch):
    """`agent run` waits on nothing but its engine: polled from 50 ms, at most every 0.1 s, not every 0.5 s."""
    from slimecli.agent.api import service

    waits: list[float] = []
    calls = iter([False] * 8 + [True])

    async def healthy() -> bool:
        return next(calls)

    async def sleep(delay: float) -> None:
        waits.append(delay)

    monkeypatch.setattr(service.asyncio, "sleep", sleep)
    asyncio.run(service.wait_engine(healthy, "http://127.0.0.1:1", timeout_s=60))
    assert len(waits) == 8 and waits[0] == 0.05 and max(waits) == service.ENGINE_POLL_S == 0.1
    assert waits == sorted(waits)


def test_an_engine_started_for_a_command_leaves_no_directory_behind(tmp_path, monkeypatch):
    """EngineProcess keeps its frozen config and log in a directory of its own: a failure quotes the log, and
    stop() ends the process and removes the directory."""
    import subprocess
    import tempfile

    from slimecli.agent.api.service import EngineProcess
    from slimecli.config.schema import SlimeConfig

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = EngineProcess(SlimeConfig())
    assert engine.workdir.parent == tmp_path and engine.config_path.is_file()

    def spawn(argv: list[str], log) -> subprocess.Popen:
        assert argv[-2:] == ["--config", str(engine.config_path)]
        return subprocess.Popen(["sh", "-c", "echo no model here; exit 3"], stdout=log, start_new_session=True)

    engine.start(spawn)
    engine.proc.wait(timeout=10)
    assert engine.failed() == "engine exited with 3:\nno model here\n"
    engine.stop()
    assert list(tmp_path.iterdir()) == []
    engine.stop()  # again (atexit calls it too): nothing left to do
