"""`slimecli agent run` shows its progress (sandbox, each turn, result) and leaves the model's text to a
transcript file. A stand-in CLI (a small script speaking the Anthropic API to the real adapter) and the
scripted test engine keep it fast; the real CLIs are exercised in test_agent_cli_real.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.helpers import ROOT, free_port, invoke_cli
from tests.helpers.scripted_claude import scripted_claude

ANSWER = "Hello from the scripted model, in a transcript."
FAKE_CLI = scripted_claude(sys.executable, max_tokens=32, timeout_s=60)


@pytest.fixture
def scripted_engine(tmp_path):
    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    tiny = str(resolve_model_path(ModelConfig()))
    port = free_port()
    script = tmp_path / "script.json"
    script.write_text(json.dumps([ANSWER]))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "scripted_engine.py"), "--model", tiny,
                             "--port", str(port), "--script", str(script)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError("the scripted engine did not start") from None
            time.sleep(0.2)
    yield tiny, url
    proc.terminate()
    proc.wait(timeout=10)


def test_agent_run_shows_progress_and_writes_the_transcript(tmp_path, scripted_engine):
    tiny, url = scripted_engine
    cli = tmp_path / "fake-claude"
    cli.write_text(FAKE_CLI)
    cli.chmod(0o755)
    out = tmp_path / "out" / "samples.jsonl"
    proc = invoke_cli("agent", "run", "agent=claude_code", f"agent.binary={cli}", "sandbox=local",
                      f"model.path={tiny}", f"agent.engine_url={url}", "task.prompt=Say hello.",
                      f"agent.output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    transcript = out.parent / "transcript.md"
    assert proc.stdout.strip() == f"transcript: {transcript}"  # the model's text is not dumped on the console
    assert ANSWER not in proc.stdout + proc.stderr
    text = transcript.read_text()
    assert "# Prompt\n\nSay hello." in text and ANSWER in text
    lines = proc.stderr.splitlines()
    order = [next(i for i, line in enumerate(lines) if marker in line)
             for marker in ("starting the engine", "sandbox local ready", "claude_code started", "turn 1: ",
                            "claude_code exited (exit 0", "1 sample(s) [completed]")]
    assert order == sorted(order), proc.stderr
    said = [i for i, line in enumerate(lines) if line.startswith("warning: sandbox=local does not isolate: ")]
    assert len(said) == 2 and said[0] < order[0] and said[1] > order[-1], proc.stderr  # at the start and the end
    [turn] = [line for line in lines if "turn 1: " in line]
    sample = json.loads(out.read_text().splitlines()[0])
    assert f"turn 1: {sample['response_length']} tokens" in turn
    assert not any("turn 2:" in line for line in lines)
