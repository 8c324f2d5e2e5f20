"""`slimecli train run.dir=RUN` with nothing else resumes RUN with its own stored settings: its optimizer, LoRA
rank, name and recipe are kept, not reset to the defaults. Overrides on the command line are compared with the
stored config: a change a resume may make is made and listed, one it may not is refused naming what would change
from what to what, and run.resume=force says which settings it changes. SWE_AGENT is such an override."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimecli.config.errors import ConfigErrors
from slimecli.config.io import load_frozen
from slimecli.launch.rundir import RunDir, prepare, program
from slimecli.launch.source_checks import load
from tests.helpers import invoke_cli


def opened(overrides: list[str]) -> RunDir:
    """What `slimecli train OVERRIDES` does to the run directory (its config read as train reads it), the lock
    released."""
    run = prepare(load(overrides, resume=True), ["slimecli", "train", *overrides], overrides)
    assert run.lock is not None
    run.lock.release()
    return run


STARTED_WITH = {
    "stateless_adam": (["optimizer=stateless_adam"], lambda c: c.optimizer.name == "stateless_adam"),
    "lora": (["trainer.lora.rank=8"], lambda c: c.trainer.lora.rank == 8),
    "name": (["run.name=x"], lambda c: c.run.name == "x"),
    "recipe": (["+recipe=env_lookup", "trainer.max_steps=3"],
               lambda c: c.recipe == "env_lookup" and c.env.name == "native" and c.trainer.max_steps == 3),
}


@pytest.mark.parametrize("case", list(STARTED_WITH))
def test_the_bare_run_dir_resumes_with_the_runs_own_settings(tmp_path: Path, case: str) -> None:
    overrides, kept = STARTED_WITH[case]
    run_dir = tmp_path / "run"
    first = opened([*overrides, f"run.dir={run_dir}"])
    assert not first.resumed and kept(load_frozen(first.config_path))
    again = opened([f"run.dir={run_dir}"])
    assert again.resumed and again.changed == []  # no refusal, nothing changed
    assert kept(load_frozen(again.config_path))
    assert not list(run_dir.glob("config.before-*.yaml"))  # nothing changed: no previous config to keep


def test_an_auto_named_run_keeps_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = opened(["run.name=killtest", "optimizer=stateless_adam"])
    assert first.path.name.startswith("killtest-")
    again = opened([f"run.dir={first.path}"])
    assert again.resumed and again.changed == []
    frozen = load_frozen(again.config_path)
    assert frozen.run.name == "killtest" and frozen.optimizer.name == "stateless_adam"


def test_an_override_is_compared_with_the_stored_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    opened(["optimizer=stateless_adam", "optimizer.lr=1e-4", f"run.dir={run_dir}"])
    same = opened(["optimizer=stateless_adam", f"run.dir={run_dir}"])  # the run's own member: no change
    assert same.changed == [] and load_frozen(same.config_path).optimizer.lr == 1e-4
    longer = opened(["trainer.max_steps=120", f"run.dir={run_dir}"])
    assert longer.changed == ["trainer.max_steps: 60 -> 120"]
    assert load_frozen(longer.config_path).optimizer.name == "stateless_adam"
    with pytest.raises(ConfigErrors) as refused:
        opened(["optimizer=adam", f"run.dir={run_dir}"])
    message = refused.value.render()
    assert "optimizer.name: 'stateless_adam' -> 'adam'" in message  # from what to what
    hint = message.split("run.resume=force to resume it changing ")[1]
    assert "optimizer.name: 'stateless_adam' -> 'adam'" in hint and "optimizer.lr: 0.0001 -> 0.005" in hint
    assert "leave these overrides out to resume the run as it is" in message
    assert load_frozen(run_dir / "config.yaml").optimizer.name == "stateless_adam"  # the refusal wrote nothing
    forced = opened(["optimizer=adam", "run.resume=force", f"run.dir={run_dir}"])
    assert "optimizer.name: 'stateless_adam' -> 'adam' (run.resume=force)" in forced.changed
    assert all(line.endswith("(run.resume=force)") for line in forced.changed if line.startswith("optimizer."))
    after = opened([f"run.dir={run_dir}"])  # force was this command's: the next resume is a plain one again
    assert after.changed == [] and load_frozen(after.config_path).run.resume == "auto"


def test_ports_and_the_commands_own_keys_come_from_the_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    opened(["rollout.port=31234", "observe.verbose=true", f"run.dir={run_dir}"])
    cfg = load([f"run.dir={run_dir}"], resume=True)
    assert cfg.rollout.port == "auto" and cfg.observe.verbose is False  # picked afresh; verbose was that command's
    assert load([f"run.dir={run_dir}", "rollout.port=31235"], resume=True).rollout.port == 31235


def test_swe_agent_is_a_change_like_any_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.delenv("SWE_AGENT", raising=False)
    opened(["+recipe=swe_agent_smoke", f"run.dir={run_dir}"])
    monkeypatch.setenv("SWE_AGENT", "claude_code")  # the run's own agent: no change
    assert opened([f"run.dir={run_dir}"]).changed == []
    monkeypatch.setenv("SWE_AGENT", "codex")
    with pytest.raises(ConfigErrors) as refused:
        opened([f"run.dir={run_dir}"])
    assert "agent.name: 'claude_code' -> 'codex' (from SWE_AGENT=codex)" in refused.value.render()


def test_config_show_shows_what_a_resume_runs_with(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    opened(["trainer.lora.rank=8", "run.name=x", f"run.dir={run_dir}"])
    out = invoke_cli("config", "show", f"run.dir={run_dir}")
    assert out.returncode == 0, out.stderr
    assert "name: x" in out.stdout and "rank: 8" in out.stdout


def test_the_printed_commands_run_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "venv" / "bin" / "slimecli"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert program(".venv/bin/slimecli") == [".venv/bin/slimecli"]  # not on PATH: the path it was started by
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert program(str(script)) == ["slimecli"]  # the one on PATH
    assert program("/some/where/python -m") == ["slimecli"]
