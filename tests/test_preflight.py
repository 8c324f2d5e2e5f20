"""Pre-flight: every command that starts something refuses what cannot run here before it starts anything, with
exit code 2, no traceback, the config key named, and the message `config validate` prints for the same input."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slimecli.config.compose import load
from slimecli.launch import preflight
from tests.helpers import free_port, invoke_cli


def errors(out: subprocess.CompletedProcess) -> list[str]:
    """The `  - key: reason (got value)` lines of a refusal (hints are on the lines after them)."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout
    return [line[4:] for line in out.stderr.splitlines() if line.startswith("  - ")]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def no_weights(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "qwen3"}')
    return d


# ---- teacher serve -----------------------------------------------------------------------------------------
def test_teacher_serve_refuses_a_directory_without_config_json_like_validate(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    line = f"teacher.model_path: not a Hugging Face checkpoint (no config.json) (got '{tmp_path / 'empty'}')"
    serve = invoke_cli("teacher", "serve", f"teacher.model_path={tmp_path / 'empty'}", f"run.dir={tmp_path / 'run'}")
    assert errors(serve) == [line]
    assert not (tmp_path / "run").exists()  # nothing written, nothing started
    assert errors(invoke_cli("config", "validate", "teacher=server", f"teacher.model_path={tmp_path / 'empty'}")) == [line]


def test_teacher_serve_refuses_a_checkpoint_without_weights_like_validate(tmp_path: Path, no_weights: Path) -> None:
    line = f"teacher.model_path: no weights in the checkpoint directory (no *.safetensors or *.bin) (got '{no_weights}')"
    serve = invoke_cli("teacher", "serve", f"teacher.model_path={no_weights}", f"run.dir={tmp_path / 'run'}")
    assert errors(serve) == [line]
    validate = invoke_cli("config", "validate", "+recipe=opd", f"teacher.model_path={no_weights}")
    assert line in errors(validate)


def test_teacher_serve_refuses_a_busy_port_like_validate(tmp_path: Path, tiny: Path, busy_port: int) -> None:
    line = f"teacher.port: 127.0.0.1:{busy_port} is in use (got {busy_port})"
    serve = invoke_cli("teacher", "serve", f"model.path={tiny}", f"teacher.port={busy_port}", f"run.dir={tmp_path / 'r'}")
    assert errors(serve) == [line]
    assert "hint: stop what listens there, or choose another teacher.port" in serve.stderr
    validate = invoke_cli("config", "validate", "+recipe=opd", f"model.path={tiny}", f"teacher.model_path={tiny}",
                          f"teacher.port={busy_port}", f"rollout.port={free_port()}")
    assert errors(validate) == [line]


def test_teacher_ranks_take_one_gpu_each(monkeypatch: pytest.MonkeyPatch, tiny: Path) -> None:
    cfg = load(["teacher=server", f"teacher.model_path={tiny}", "teacher.tp=2", "teacher.dp=2",
                f"teacher.port={free_port()}", f"rollout.port={free_port()}"])
    monkeypatch.setattr(preflight, "cuda_devices", lambda: 2)
    (error,) = preflight.teacher_serve_errors(cfg)
    assert error.path == "teacher.tp" and "= 4 ranks take one GPU each, and this machine has 2" in error.reason
    assert preflight.train_errors(cfg) == [error]  # train launches the same teacher: the same refusal
    monkeypatch.setattr(preflight, "cuda_devices", lambda: 0)  # no GPU: the ranks share the CPU (gloo)
    assert preflight.teacher_serve_errors(cfg) == []


# ---- rollout serve -----------------------------------------------------------------------------------------
def test_rollout_serve_refuses_a_busy_port_like_validate(busy_port: int) -> None:
    line = f"rollout.port: 127.0.0.1:{busy_port} is in use (got {busy_port})"
    assert errors(invoke_cli("rollout", "serve", f"rollout.port={busy_port}")) == [line]
    assert errors(invoke_cli("config", "validate", f"rollout.port={busy_port}")) == [line]
    assert errors(invoke_cli("plan", f"rollout.port={busy_port}")) == [line]
    # --index i listens on rollout.port + i
    assert errors(invoke_cli("rollout", "serve", f"rollout.port={busy_port - 1}", "--index", "1")) == [line]


def test_rollout_serve_refuses_a_checkpoint_without_weights_like_validate(no_weights: Path) -> None:
    line = f"model.path: no weights in the checkpoint directory (no *.safetensors or *.bin) (got '{no_weights}')"
    tokenizer = f"model.path: no tokenizer in the directory (none of {', '.join(preflight.TOKENIZER_FILES)}) " \
                f"(got '{no_weights}')"
    assert errors(invoke_cli("rollout", "serve", f"model.path={no_weights}")) == [line, tokenizer]
    assert errors(invoke_cli("config", "validate", f"model.path={no_weights}")) == [line, tokenizer]


def test_rollout_device_must_exist_here() -> None:
    serve = errors(invoke_cli("rollout", "serve", "rollout.device=cuda:99"))
    assert len(serve) == 1 and serve[0].startswith("rollout.device: ") and serve[0].endswith("(got 'cuda:99')")
    assert errors(invoke_cli("config", "validate", "rollout.device=cuda:99")) == serve


def test_engine_keys_are_config_keys_with_rules() -> None:
    shown = yaml.safe_load(invoke_cli("config", "show").stdout)["rollout"]
    assert shown["device"] == "auto" and shown["prefix_cache_mb"] == 1024
    out = errors(invoke_cli("config", "validate", "rollout.device=tpu", "rollout.prefix_cache_mb=-1"))
    assert sorted(out) == ["rollout.device: not an allowed value (got 'tpu')",  # reported together, any order
                           "rollout.prefix_cache_mb: must be >= 0 (0 turns it off) (got -1)"]
    out = errors(invoke_cli("config", "validate", "rollout=sglang", "rollout.device=cuda"))
    assert "rollout.device: applies to the embedded engine (rollout=local) (got 'cuda')" in out


def test_engine_process_gets_its_settings_from_the_run_config(monkeypatch: pytest.MonkeyPatch, tiny: Path) -> None:
    """rollout.device, rollout.prefix_cache_mb, model.trust_remote_code and run.log_level reach the engine."""
    from slimecli.engine import __main__ as engine_main
    from slimecli.engine import app, server
    from slimecli.model import loading

    seen: dict[str, object] = {}

    async def fake_serve(srv: server.EngineServer, stop: object = None) -> None:
        seen.update(device=srv.device, cache=srv.settings.prefix_cache_mb << 20, trust=loading._trust_remote_code)

    monkeypatch.setattr(app, "serve", fake_serve)
    monkeypatch.setattr(loading, "_trust_remote_code", False)
    cfg = load([f"model.path={tiny}", "rollout.port=30000", "rollout.device=cpu", "rollout.prefix_cache_mb=3",
                "model.trust_remote_code=true", "run.log_level=warning"])
    engine_main.start(cfg)
    assert seen == {"device": "cpu", "cache": 3 << 20, "trust": True}


# ---- agent serve / agent run -------------------------------------------------------------------------------
def test_agent_commands_need_an_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWE_AGENT", raising=False)
    for command in ("serve", "run"):
        out = invoke_cli("agent", command, "task.prompt=x")
        assert errors(out) == ["agent: no agent chosen (got 'none')"]
        assert "pass agent=NAME (valid: claude_code, codex) or set SWE_AGENT" in out.stderr


def test_agent_serve_refuses_a_busy_adapter_port(busy_port: int) -> None:
    out = invoke_cli("agent", "serve", "agent=codex", f"agent.port={busy_port}", "agent.engine_url=http://127.0.0.1:9")
    assert errors(out) == [f"agent.port: 127.0.0.1:{busy_port} is in use (got {busy_port})"]


def test_agent_serve_refuses_a_bad_engine_url_like_validate() -> None:
    line = "agent.engine_url: must start with http:// or https:// (got 'localhost:1')"
    assert errors(invoke_cli("agent", "serve", "agent=codex", "agent.engine_url=localhost:1")) == [line]
    assert errors(invoke_cli("config", "validate", "agent.engine_url=localhost:1")) == [line]


def test_agent_run_refuses_a_missing_cli_like_validate(tmp_path: Path) -> None:
    binary = tmp_path / "claude"
    line = f"agent: agent.binary={binary} is not an executable (got 'claude_code')"
    run = invoke_cli("agent", "run", "agent=claude_code", f"agent.binary={binary}", "task.prompt=x")
    assert errors(run) == [line] and "run `slimecli agent install claude_code`" in run.stderr
    validate = invoke_cli("config", "validate", "+recipe=swe_agent", f"agent.binary={binary}")
    assert errors(validate) == [line]


def test_agent_run_needs_a_task(tmp_path: Path) -> None:
    ok_cli = ["agent=codex", "agent.binary=/bin/true", "agent.engine_url=http://127.0.0.1:9"]
    assert errors(invoke_cli("agent", "run", *ok_cli)) == ["task.prompt: agent run needs a task (got None)"]
    missing = tmp_path / "nope"
    assert errors(invoke_cli("agent", "run", *ok_cli, "task.prompt=x", f"task.workdir={missing}")) == [
        f"task.workdir: directory does not exist (got '{missing}')"]
    out = invoke_cli("agent", "run", *ok_cli, "task=swe")
    assert errors(out) == ["task.instance: agent run with task=swe works one task (got None)"]
    assert "slimecli tasks list" in out.stderr


def test_agent_run_refuses_an_unavailable_sandbox(tmp_path: Path) -> None:
    out = invoke_cli("agent", "run", "agent=codex", "agent.binary=/bin/true", "task.prompt=x", "sandbox=docker",
                  f"sandbox.binary={tmp_path / 'docker'}", "agent.engine_url=http://127.0.0.1:9")
    (line,) = errors(out)
    assert line.startswith("sandbox: ") and line.endswith("(got 'docker')")


# ---- train's own pre-flight, the same components -----------------------------------------------------------
def test_parallel_sizes_are_megatron_keys() -> None:
    out = errors(invoke_cli("config", "validate", "trainer.pipeline_parallel_size=2"))
    assert out == ["trainer.pipeline_parallel_size: the torch trainer is data-parallel only; tensor/pipeline "
                   "parallel sizes must be 1 (got 2)"]


def test_servers_of_other_nodes_are_not_checked_here(busy_port: int, tmp_path: Path) -> None:
    cfg = load([f"rollout.port={busy_port}", "cluster.nnodes=2", "cluster.node_rank=1", f"run.dir={tmp_path}"])
    assert preflight.server_errors(cfg) == []
    assert [e.path for e in preflight.server_errors(dataclasses.replace(
        cfg, cluster=dataclasses.replace(cfg.cluster, node_rank=0)))] == ["rollout.port"]


def test_port_problem() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert preflight.port_problem("127.0.0.1", port) == f"127.0.0.1:{port} is in use"
    assert preflight.port_problem("127.0.0.1", port) is None  # closed again (a TIME_WAIT port is no problem)
    assert "cannot" in (preflight.port_problem("no-such-host.invalid", 1) or "")


def test_plugin_functions_are_looked_for_before_anything_starts(tmp_path: Path) -> None:
    """rollout.generate, trainer.advantage_estimator and trainer.policy_loss given as import paths: the config
    layer checks the text, pre-flight finds the function (nothing imported), and every command that reads a
    config (a finished run's too) reports all of them at once, before it starts anything."""
    (tmp_path / "mine.py").write_text("def other(batch, cfg):\n    return batch\n")
    bad = [f"rollout.generate={tmp_path}/mine.py:collect", "trainer.advantage_estimator=no_such_pkg.adv:fn",
           f"trainer.policy_loss={tmp_path}/gone.py:loss"]
    lines = [f"rollout.generate: cannot find the rollout function: file {tmp_path}/mine.py defines no 'collect'; "
             f"it defines: other (got '{tmp_path}/mine.py:collect')",
             "trainer.advantage_estimator: cannot find the advantage estimator: module no_such_pkg.adv not found on "
             "the Python path (got 'no_such_pkg.adv:fn')",
             f"trainer.policy_loss: cannot find the policy loss: file {tmp_path}/gone.py does not exist "
             f"(got '{tmp_path}/gone.py:loss')"]
    assert errors(invoke_cli("config", "validate", *bad)) == lines
    assert errors(invoke_cli("train", *bad, f"run.dir={tmp_path / 'run'}")) == lines
    assert errors(invoke_cli("eval", *bad, f"run.root={tmp_path}")) == lines
    run = tmp_path / "done"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "config.yaml").write_text(invoke_cli("config", "show").stdout)
    assert errors(invoke_cli("eval", f"run.dir={run}", *bad)) == lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "mine.py"]  # nothing was started
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "final"]
