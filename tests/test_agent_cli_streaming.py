"""The real Claude Code and Codex CLIs on streamed turns (the engine streams token by token: THE TEST ENGINE
with `stream: true`, tests/helpers/streaming_engine.py), and what Codex does with an incomplete response."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_agent_cli_real import agent_run, check_sample, engine_log, needs_cli, scripted_ids, tool_call, wait_http

from tests.helpers import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.agent_cli]
LONG = ("Streaming works: this reply is long enough to reach the CLI in many small deltas, one after another, "
        "while the engine is still sampling the rest of it.")


@pytest.fixture(scope="module")
def tiny() -> str:
    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    return str(resolve_model_path(ModelConfig()))


@pytest.fixture
def streaming(tmp_path, tiny):
    """Start the streaming test engine with a given script; yields its URL."""
    procs = []

    def start(script: list) -> str:
        port = free_port()
        path = tmp_path / f"script{len(procs)}.json"
        path.write_text(json.dumps(script))
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "streaming_engine.py"),
                                       "--model", tiny, "--port", str(port), "--script", str(path)], cwd=ROOT))
        wait_http(f"http://127.0.0.1:{port}/health")
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


@needs_cli("claude_code")
def test_claude_streamed_text_and_tool_turns(tmp_path, tiny, streaming):
    target = tmp_path / "ws" / "hello.txt"
    texts = ["Let me write the file. " + tool_call("Write", {"file_path": str(target), "content": "streamed\n"}),
             LONG]
    url = streaming(texts)
    proc, [s], _ = agent_run("claude_code", tmp_path, tiny, "Write hello.txt", f"agent.engine_url={url}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert target.read_text() == "streamed\n" and LONG in (tmp_path / "transcript.md").read_text()  # the model's text
    assert all(r["stream"] for r in engine_log(url)["requests"])  # both turns were streamed from the engine
    assert s["metadata"]["turns"] == 2 and s["status"] == "completed"
    check_sample(s, scripted_ids(tiny, texts))  # the recorded turns are the engine's tokens, unchanged


@needs_cli("codex")
def test_codex_streamed_text_turn(tmp_path, tiny, streaming):
    url = streaming([LONG])
    proc, [s], _ = agent_run("codex", tmp_path, tiny, "Say something long.", f"agent.engine_url={url}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert LONG in (tmp_path / "transcript.md").read_text() and [r["stream"] for r in engine_log(url)["requests"]] == [True]
    check_sample(s, scripted_ids(tiny, [LONG]))


@needs_cli("codex")
def test_codex_on_an_incomplete_response_shows_the_text_reports_it_and_does_not_retry(tmp_path, tiny, streaming):
    """A reply cut by the length limit is `status: incomplete` (response.incomplete). The pinned Codex prints the
    partial text, reports "Incomplete response returned, reason: max_output_tokens" and ends its run (exit 1)
    without retrying; the cut turn is recorded as a truncated sample."""
    url = streaming(["Hello codex."])
    proc, [first], _ = agent_run("codex", tmp_path, tiny, "Say hello.", f"agent.engine_url={url}",
                                 "agent.max_context_len=20000")  # Codex's prompt depends on whether it has one
    assert proc.returncode == 0, proc.stderr[-3000:]
    prompt_len = engine_log(url)["requests"][0]["input_len"]
    # The same run again with a context window a few tokens past that prompt (Codex shortens its prompt for a
    # small window, so the room left is a few hundred tokens): a reply longer than that is cut by the window.
    url = streaming([LONG * 30] * 3)
    proc, [s], _ = agent_run("codex", tmp_path, tiny, "Say hello.", f"agent.engine_url={url}",
                             f"agent.max_context_len={prompt_len + 6}")
    out = s["metadata"]["cli_stdout"] + s["metadata"]["cli_stderr"]
    assert "Incomplete response returned, reason: max_output_tokens" in out, out[-3000:]
    assert s["metadata"]["exit_code"] == 1 and not s["metadata"]["timed_out"]
    assert len(engine_log(url)["requests"]) <= 1  # no retry loop
    assert s["status"] == "truncated" and s["metadata"]["turns"] == 1 and s["metadata"]["context_truncated"]
    if engine_log(url)["requests"]:
        assert LONG[:10] in out  # the partial text was shown
