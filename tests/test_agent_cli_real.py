"""The real Claude Code and Codex CLIs against slimecli's adapters, through `slimecli agent run` / `serve`.

Plain-text turns use the real embedded engine with the tiny random model (its text is garbage, but it must
reach the CLI's output unchanged). Tool turns need a well-formed tool call, which a random model cannot
produce: they use THE TEST ENGINE tests/helpers/scripted_engine.py (scripted outputs, same /generate API).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from slimecli.agent.harness.clis import codex_flags
from slimecli.agent.harness.install import locate
from tests.helpers import ROOT, free_port, host_processes_with, run_cli, wait_dead

pytestmark = [pytest.mark.slow, pytest.mark.agent_cli]
CLIS = {"claude_code": locate("claude_code"), "codex": locate("codex")}


def needs_cli(agent: str):
    return pytest.mark.skipif(CLIS[agent] is None, reason=f"the {agent} CLI is not installed: run "
                              f"`slimecli agent install {agent}` (CI does)")


@pytest.fixture(scope="module")
def tiny() -> str:
    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    return str(resolve_model_path(ModelConfig()))


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not ready")


@pytest.fixture(scope="module")
def scripted_pool(tmp_path_factory, tiny):
    """Scripted test engines started once for the module (a test may hold two at once); each test resets them."""
    procs, urls = [], []

    def start() -> str:
        port = free_port()
        path = tmp_path_factory.mktemp("scripted") / "script.json"
        path.write_text("[]")
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "scripted_engine.py"), "--model",
                                       tiny, "--port", str(port), "--script", str(path)], cwd=ROOT))
        wait_http(f"http://127.0.0.1:{port}/health")
        urls.append(f"http://127.0.0.1:{port}")
        return urls[-1]

    yield urls, start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


@pytest.fixture
def scripted(scripted_pool):
    """Give the test a scripted engine with the given script (a fresh log); yields its URL."""
    urls, start = scripted_pool
    taken = 0

    def use(script: list) -> str:
        nonlocal taken
        url = urls[taken] if taken < len(urls) else start()
        taken += 1
        request = urllib.request.Request(f"{url}/script/reset", data=json.dumps({"script": script}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
        return url

    return use


def engine_log(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/script/log", timeout=5) as r:
        return json.loads(r.read())


def agent_run(agent: str, tmp_path: Path, tiny: str, prompt: str, *extra: str, timeout: float = 300):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    out = tmp_path / "samples.jsonl"
    proc = run_cli("agent", "run", f"agent={agent}", f"model.path={tiny}", f"task.prompt={prompt}",
                   f"task.workdir={ws}", f"agent.output={out}", *extra, timeout=timeout)
    samples = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, samples, ws


def check_sample(s: dict, sampled_turns: list[list[int]] | None = None) -> None:
    """tokens = prompt + response; mask and log-probs per response token; mask 1 exactly on sampled tokens."""
    n, r = len(s["tokens"]), s["response_length"]
    assert 0 < r < n and len(s["loss_mask"]) == len(s["rollout_log_probs"]) == r
    assert set(s["loss_mask"]) <= {0, 1} and s["loss_mask"][0] == 1 and not s["remove_sample"]
    assert all(lp == 0.0 for lp, m in zip(s["rollout_log_probs"], s["loss_mask"], strict=True) if not m)
    if sampled_turns is not None:
        response = s["tokens"][n - r:]
        assert [t for t, m in zip(response, s["loss_mask"], strict=True) if m] == [t for turn in sampled_turns for t in turn]


def scripted_ids(tiny: str, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    return [tok.encode(t, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")] for t in texts]


def tool_call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


@needs_cli("claude_code")
def test_claude_plain_text_turn_real_engine(tmp_path, tiny):
    proc, [s], _ = agent_run("claude_code", tmp_path, tiny, "Say hello.", "agent.max_new_tokens=12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert s["metadata"]["exit_code"] == 0 and s["metadata"]["turns"] == 1
    check_sample(s)
    text = s["response"].removesuffix("<|im_end|>").strip()
    assert text and text in s["metadata"]["cli_stdout"] and text in (tmp_path / "transcript.md").read_text()


@needs_cli("codex")
def test_codex_plain_text_turn_real_engine(tmp_path, tiny):
    proc, [s], _ = agent_run("codex", tmp_path, tiny, "Say hello.", "agent.max_new_tokens=12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert s["metadata"]["exit_code"] == 0 and s["metadata"]["turns"] == 1
    check_sample(s)
    text = s["response"].removesuffix("<|im_end|>").strip()
    assert text and text in s["metadata"]["cli_stdout"]


@needs_cli("codex")
def test_codex_takes_the_config_that_keeps_it_off_the_network(tmp_path):
    """The config.toml a codex run gets (a valid TOML file the pinned Codex reads without complaint) turns off what
    Codex does at start-up beyond the task: its release check, analytics, the plugin sync from GitHub."""
    import tomllib

    from slimecli.agent.harness.clis import codex_config_toml

    text = codex_config_toml("http://127.0.0.1:1", "tiny", 4096)
    config = tomllib.loads(text)
    assert config["check_for_update_on_startup"] is False and config["analytics"] == {"enabled": False}
    assert config["model_providers"]["slimecli"]["base_url"] == "http://127.0.0.1:1/v1"
    (tmp_path / "config.toml").write_text(text)
    env = {**os.environ, "CODEX_HOME": str(tmp_path)}
    proc = subprocess.run([CLIS["codex"], "features", "list"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    features = {line.split()[0]: line.split()[-1] for line in proc.stdout.splitlines() if len(line.split()) >= 3}
    assert features["plugins"] == "false", proc.stdout[-2000:]


@needs_cli("claude_code")
def test_claude_tool_turn_writes_a_file(tmp_path, tiny, scripted):
    target = tmp_path / "ws" / "hello.txt"
    texts = [tool_call("Write", {"file_path": str(target), "content": "hi from the tool\n"}), "Wrote hello.txt."]
    url = scripted(texts)
    proc, [s], _ = agent_run("claude_code", tmp_path, tiny, "Write hello.txt", f"agent.engine_url={url}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert target.read_text() == "hi from the tool\n"
    assert "Wrote hello.txt." in (tmp_path / "transcript.md").read_text()
    assert s["metadata"]["turns"] == 2 and s["status"] == "completed"
    check_sample(s, scripted_ids(tiny, texts))
    assert "<tool_response>\nFile created successfully" in s["response"]  # the tool result went back as context
    assert len(engine_log(url)["requests"]) == 2


@needs_cli("codex")
def test_codex_tool_turn_runs_a_command(tmp_path, tiny, scripted):
    texts = [tool_call("exec_command", {"cmd": "printf 'hi from the tool' > hello.txt"}), "Wrote hello.txt."]
    url = scripted(texts)
    proc, [s], ws = agent_run("codex", tmp_path, tiny, "Write hello.txt", f"agent.engine_url={url}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ws / "hello.txt").read_text() == "hi from the tool"
    assert "Wrote hello.txt." in (tmp_path / "transcript.md").read_text()
    assert s["metadata"]["turns"] == 2 and s["status"] == "completed"
    check_sample(s, scripted_ids(tiny, texts))
    assert "Process exited with code 0" in s["response"]


@needs_cli("claude_code")
def test_agent_serve_with_a_user_run_claude(tmp_path, tiny, scripted):
    """The documented flow: `agent serve` prints the base URL; the user runs `claude -p` against it."""
    url = scripted(["Hello from the served model."])
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "slimecli", "agent", "serve", "agent=claude_code",
                              f"model.path={tiny}", f"agent.engine_url={url}", f"agent.port={port}"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        banner = serve.stdout.readline() + serve.stdout.readline()
        assert f"ANTHROPIC_BASE_URL=http://127.0.0.1:{port}" in banner
        home = tmp_path / "home"
        home.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
               "ANTHROPIC_API_KEY": "my-session", "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        proc = subprocess.run([CLIS["claude_code"], "-p", "hi"], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and "Hello from the served model." in proc.stdout, proc.stderr[-2000:]
    finally:
        serve.terminate()
        serve.wait(timeout=20)


@needs_cli("codex")
def test_codex_with_the_printed_provider_flags(tmp_path, tiny, scripted):
    """What `agent serve agent=codex` prints (the -c provider flags) works with a plain `codex exec`."""
    from aiohttp import web  # noqa: F401 - the adapter stack below is the one `agent serve` runs

    url = scripted(["Hello codex."])
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "slimecli", "agent", "serve", "agent=codex", f"model.path={tiny}",
                              f"agent.engine_url={url}", f"agent.port={port}"], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        banner = serve.stdout.readline() + serve.stdout.readline()
        flags = codex_flags(f"http://127.0.0.1:{port}", Path(tiny).name)
        assert flags[3] in banner
        home = tmp_path / "codex_home"
        home.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home), "OPENAI_API_KEY": "sid"}
        proc = subprocess.run([CLIS["codex"], "exec", "--skip-git-repo-check", *flags, "hi"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0 and "Hello codex." in proc.stdout, proc.stderr[-2000:]
    finally:
        serve.terminate()
        serve.wait(timeout=20)


def test_hanging_cli_is_killed_at_the_budget_and_yields_an_aborted_sample(tmp_path, tiny, scripted):
    marker = f"slimecli-hang-{os.getpid()}-{time.monotonic_ns()}"
    fake = tmp_path / "fake-claude"
    started = tmp_path / "ws" / "started"
    fake.write_text(f"#!/bin/sh\ntrap '' TERM\npython3 -c 'import time; time.sleep(300)' {marker} &\n"
                    f"echo up > {started}\nwait\n")
    fake.chmod(0o755)
    url = scripted([])
    proc, [s], _ = agent_run("claude_code", tmp_path, tiny, "hang", f"agent.engine_url={url}",
                             f"agent.binary={fake}", "agent.time_budget_s=3")
    assert proc.returncode == 1 and "wall_clock_timeout" in proc.stderr, proc.stderr[-2000:]
    assert s["metadata"]["abort_reason"] == "wall_clock_timeout" and s["status"] == "aborted"
    assert (s["response_length"], s["loss_mask"], s["rollout_log_probs"], s["reward"], s["remove_sample"]) == \
        (1, [0], [0.0], 0.0, True)
    assert started.read_text() == "up\n"  # it did run, and everything it started is gone
    assert host_processes_with(marker) == []


def _bwrap_missing() -> str | None:
    from slimecli.sandbox.bwrap import available

    return available()


@needs_cli("codex")
@pytest.mark.skipif(_bwrap_missing() is not None, reason=f"bwrap cannot start here: {_bwrap_missing()}")
def test_codex_tool_commands_run_inside_the_bwrap_sandbox(tmp_path, tiny, scripted):
    """The CLI reached its adapter through the relay, and its tool ran isolated: another host name, the
    project checkout and the caller's files invisible."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    cmd = f"hostname > where.txt; cat {secret} > leak.txt 2>&1; ls {ROOT} > checkout.txt 2>&1; true"
    texts = [tool_call("exec_command", {"cmd": cmd}), "Looked around."]
    url = scripted(texts)
    proc, [s], ws = agent_run("codex", tmp_path, tiny, "Look around", f"agent.engine_url={url}", "sandbox=bwrap")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ws / "where.txt").read_text() == "sandbox\n"
    assert "host only" not in (ws / "leak.txt").read_text()
    assert "pyproject.toml" not in (ws / "checkout.txt").read_text()
    assert s["metadata"]["turns"] == 2 and s["status"] == "completed"


def test_missing_cli_is_refused_before_the_run_and_swe_agent_picks_the_agent(tmp_path, tiny, scripted,
                                                                              monkeypatch):
    url = scripted([])
    ws, out = tmp_path / "ws", tmp_path / "samples.jsonl"
    ws.mkdir()
    args = [f"model.path={tiny}", "task.prompt=x", f"task.workdir={ws}", f"agent.output={out}",
            f"agent.engine_url={url}", f"agent.binary={tmp_path / 'no-such-codex'}"]
    proc = run_cli("agent", "run", *args, env={"SWE_AGENT": "codex"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not out.exists()
    assert f"agent: agent.binary={tmp_path / 'no-such-codex'} is not an executable (got 'codex')" in proc.stderr

    # a CLI gone by the time the run starts (pre-flight passed) is an aborted sample, never a crash
    import asyncio

    from slimecli.agent.api.service import AgentService
    from slimecli.agent.harness.jobs import AgentJob
    from slimecli.agent.harness.task import run_task
    from slimecli.config.compose import load

    monkeypatch.setenv("SWE_AGENT", "codex")
    service = AgentService(load(args, uses_agent=True), port=0)

    async def main():
        await service.start()
        try:
            return await run_task(service, AgentJob("x", str(ws)))
        finally:
            await service.stop()

    [s] = asyncio.run(main())
    assert s.metadata["abort_reason"] == "cli_missing"
    assert s.metadata["agent"] == "codex" and "no-such-codex" in s.metadata["error"]
    assert s.remove_sample is True and s.loss_mask == [0] and s.status.value == "aborted"


@needs_cli("claude_code")
def test_claude_over_max_turns_gets_429_stops_and_keeps_the_captured_turns(tmp_path, tiny, scripted):
    target = tmp_path / "ws" / "a.txt"
    url = scripted([tool_call("Write", {"file_path": str(target), "content": "1"}), "never sent"])
    proc, [s], _ = agent_run("claude_code", tmp_path, tiny, "go", f"agent.engine_url={url}", "agent.max_turns=1",
                             "agent.time_budget_s=120")
    assert s["metadata"]["exit_code"] not in (None, 0) and not s["metadata"]["timed_out"]  # no retry loop
    assert "agent.max_turns=1" in s["metadata"]["cli_stdout"] + s["metadata"]["cli_stderr"]
    assert s["metadata"]["turns"] == 1 and target.read_text() == "1"
    check_sample(s)
    assert len(engine_log(url)["requests"]) == 1


@needs_cli("claude_code")
def test_claude_waiting_on_a_stuck_engine_is_killed_and_the_engine_request_aborted(tmp_path, tiny, scripted):
    url = scripted([{"hang": True}])
    proc, [s], _ = agent_run("claude_code", tmp_path, tiny, "go", f"agent.engine_url={url}", "agent.time_budget_s=8")
    assert s["metadata"]["abort_reason"] == "wall_clock_timeout" and s["remove_sample"] is True
    log = engine_log(url)
    assert [r["rid"] for r in log["requests"]] == log["aborted"]  # the CLI went away: its request was aborted


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_agent_serve_starts_the_real_engine_and_sigterm_stops_both(tmp_path, tiny):
    import signal

    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "slimecli", "agent", "serve", "agent=codex", f"model.path={tiny}",
                              f"agent.port={port}"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=180)
        assert "model_provider=slimecli" in serve.stdout.readline() + serve.stdout.readline()
        engines = children(serve.pid)
        assert engines, "the engine runs as a child of agent serve"
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
        assert wait_dead(engines, timeout=30) == []
    finally:
        if serve.poll() is None:
            serve.kill()


def _swe_task(instance: str) -> dict:
    from slimecli.swe.builtin import task_file

    return next(r for r in map(json.loads, task_file("swe_tiny").read_text().splitlines())
                if r["instance_id"] == instance)


def _apply_command(patch: str) -> str:
    import base64

    return f"printf %s {base64.b64encode(patch.encode()).decode()} | base64 -d | git apply"


def swe_run(agent: str, tmp_path: Path, tiny: str, url: str, instance: str, *extra: str):
    out = tmp_path / f"{agent}-{instance}.jsonl"
    proc = run_cli("agent", "run", f"agent={agent}", "task=swe", f"task.instance={instance}", f"model.path={tiny}",
                   f"agent.engine_url={url}", f"agent.output={out}", *extra, timeout=300)
    samples = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, samples


SWE_TOOL = {"claude_code": lambda cmd: tool_call("Bash", {"command": cmd, "description": "edit"}),
            "codex": lambda cmd: tool_call("exec_command", {"cmd": cmd})}


@pytest.mark.parametrize("agent", ["claude_code", "codex"])
def test_swe_task_the_gold_edit_resolves_and_a_wrong_edit_does_not(agent, tmp_path, tiny, scripted):
    """The real CLI edits a swe_tiny task in the bwrap sandbox; the diff is graded by the hidden tests."""
    if CLIS[agent] is None:
        pytest.skip(f"the {agent} CLI is not installed")
    task = _swe_task("tiny-calc-003")
    gold = scripted([SWE_TOOL[agent](_apply_command(task["patch"])), "Fixed."])
    proc, [s] = swe_run(agent, tmp_path, tiny, gold, "tiny-calc-003")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert s["reward"] == {"resolved": 1, "f2p": 1.0, "p2p": 1.0, "applied": 1, "touched_tests": 0, "reward": 1.0}
    meta = s["metadata"]
    assert meta["instance_id"] == "tiny-calc-003" and meta["sandbox"] == "bwrap" and meta["agent"] == agent
    assert "calc.py" in meta["diff"] and "PROBLEM_STATEMENT.md" not in meta["diff"]
    assert set(meta["grade"]["tests"].values()) == {"passed"}
    check_sample(s)
    # what the model saw: the problem statement (through the CLI), never the hidden tests
    from transformers import AutoTokenizer

    seen = AutoTokenizer.from_pretrained(tiny).decode(s["tokens"])
    assert "Floor division does not work" in seen and "test_issue_003" not in seen

    wrong = scripted([SWE_TOOL[agent]("echo '# looked at it' >> calc.py"), "Fixed."])
    first = s
    proc, [s] = swe_run(agent, tmp_path, tiny, wrong, "tiny-calc-003")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert s["reward"]["resolved"] == 0 and s["reward"]["applied"] == 1 and s["reward"]["f2p"] == 0.0
    assert "looked at it" in s["metadata"]["diff"]
    # two runs in two sandboxes: their requests share most of the CLI's prompt, so the engine's prefix cache
    # serves it to every run of a step (a sandbox path early in the system prompt would end it there)
    a, b = first["tokens"][:-first["response_length"]], s["tokens"][:-s["response_length"]]
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    assert shared >= 0.6 * len(a), (shared, len(a))


@needs_cli("codex")
def test_swe_agent_env_picks_the_cli_of_a_swe_run(tmp_path, tiny, scripted):
    """SWE_AGENT=codex with no agent= on the command line: the frozen choice is codex, and codex ran."""
    url = scripted(["Nothing to do."])
    out = tmp_path / "s.jsonl"
    proc = run_cli("agent", "run", "task=swe", "task.instance=tiny-wrap-001", f"model.path={tiny}",
                   f"agent.engine_url={url}", f"agent.output={out}", env={"SWE_AGENT": "codex"}, timeout=300)
    [s] = [json.loads(line) for line in out.read_text().splitlines()]
    assert s["metadata"]["agent"] == "codex", proc.stderr[-2000:]
    assert s["reward"]["resolved"] == 0 and s["reward"]["applied"] == 0  # an empty diff scores 0
