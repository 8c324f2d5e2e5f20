"""sandbox=auto never runs an agent unisolated: bwrap where it starts, else podman or docker where one starts with
its image local, else the commands that run model-written code refuse at validation (exit 2, how to install
bubblewrap, `sandbox=local` to choose no isolation by name), and an explicit sandbox=local says what it leaves
open.

The machine without a sandbox is made by PATH: a directory linking every program of this PATH but bwrap, podman
and docker, so the probes themselves run and find nothing. Stand-in bwrap and podman clients (scripts on that PATH)
show the probes judge by what starts, not by what is installed; the real podman is tried where it has an image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slimecli.config.groups.sandbox import SandboxConfig
from tests.helpers import invoke_cli

HIDDEN = ("bwrap", "podman", "docker")
GOOD_IMAGE = "localhost/present:1"
FAKE_PODMAN = f"""#!/bin/sh
# a podman stand-in: it answers `info`, has {GOOD_IMAGE} and a broken image, and `run` reports how it went
case "$1" in
  info) echo amd64 ;;
  image) case "$3" in {GOOD_IMAGE}|localhost/broken:1) exit 0 ;; esac
         echo "Error: $3: image not known" >&2; exit 125 ;;
  run) for a in "$@"; do [ "$a" = localhost/broken:1 ] && {{ echo "Error: crun: cgroups in hybrid mode not supported" >&2; exit 126; }}; done
       exit 0 ;;
  *) exit 0 ;;
esac
"""
FAKE_BWRAP = """#!/bin/sh
echo "bwrap: setting up uid map: Permission denied" >&2
exit 1
"""


def _clear_probes() -> None:
    from slimecli.sandbox.auto import choose
    from slimecli.sandbox.bwrap import available

    available.cache_clear()
    choose.cache_clear()


@pytest.fixture
def no_sandbox_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This PATH without bwrap, podman and docker (each program linked into one directory); the probes run afresh."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = bare / entry.name
            if entry.name not in HIDDEN and not target.exists() and not target.is_symlink():
                target.symlink_to(entry.path)
    monkeypatch.setenv("PATH", str(bare))
    assert all(shutil.which(name) is None for name in HIDDEN)
    _clear_probes()
    yield bare
    _clear_probes()


def _add(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(script)
    path.chmod(0o755)


def test_without_any_sandbox_agent_commands_refuse_with_the_install_hint(no_sandbox_path, tmp_path):
    runs = tmp_path / "runs"
    outs = {"config validate": invoke_cli("config", "validate", "+recipe=swe_agent"),
            "train": invoke_cli("train", "+recipe=swe_agent", f"run.root={runs}"),
            "agent run": invoke_cli("agent", "run", "agent=codex", "agent.binary=/bin/true", "task.prompt=x",
                                    "agent.engine_url=http://127.0.0.1:9"),
            "tasks check": invoke_cli("tasks", "check", "task.instance=tiny-calc-003"),
            "eval": invoke_cli("eval", "+recipe=swe_agent", 'eval.datasets=[{name: t, task: swe, path: "builtin:swe_tiny"}]',
                               f"run.root={runs}")}
    for command, out in outs.items():
        assert out.returncode == 2, (command, out.stderr)
        assert "Traceback" not in out.stderr, (command, out.stderr)
        [line] = [x for x in out.stderr.splitlines() if x.strip().startswith("- sandbox: ")]
        assert "bwrap is not installed; podman is not installed; docker is not installed" in line, line
        assert line.endswith("(got 'auto')"), line
        hint = out.stderr[out.stderr.index(line):]
        assert "apt-get install bubblewrap" in hint and "choose sandbox=local explicitly" in hint, (command, hint)
    assert not runs.exists()  # refused before anything was written


def test_an_explicit_local_runs_and_says_what_it_leaves_open(no_sandbox_path):
    out = invoke_cli("config", "validate", "+recipe=swe_agent", "sandbox=local")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK: recipe=swe_agent")
    [warning] = [x for x in out.stderr.splitlines() if x.startswith("warning: sandbox=local does not isolate")]
    assert "reach every loopback port" in warning and "read and write every file this user can" in warning


def test_a_run_without_an_agent_needs_no_sandbox(no_sandbox_path):
    out = invoke_cli("config", "validate")  # the quickstart runs no model-written code
    assert out.returncode == 0 and "sandbox" not in out.stderr, out.stderr


def test_an_installed_bwrap_that_cannot_start_is_passed_over(no_sandbox_path):
    from slimecli.sandbox.auto import choose
    from slimecli.sandbox.factory import SandboxUnavailable, make_sandbox, unavailable

    _add(no_sandbox_path, "bwrap", FAKE_BWRAP)
    choice = choose(SandboxConfig())
    assert choice.kind is None
    assert "bwrap cannot create its namespaces here: bwrap: setting up uid map: Permission denied" in choice.why_none()
    assert unavailable(SandboxConfig()) == choice.describe()
    with pytest.raises(SandboxUnavailable, match="choose sandbox=local explicitly"):
        make_sandbox(SandboxConfig(name="auto"))  # at run time too: never local in silence


def test_podman_is_taken_only_with_its_image_local_and_a_container_that_starts(no_sandbox_path):
    from slimecli.sandbox.auto import choose

    _add(no_sandbox_path, "podman", FAKE_PODMAN)
    missing = choose(SandboxConfig(image="localhost/absent:1"))
    assert missing.kind is None
    assert "podman: the image localhost/absent:1 is not among its local images (auto never pulls" in missing.why_none()
    broken = choose(SandboxConfig(image="localhost/broken:1"))
    assert broken.kind is None
    assert "a container of localhost/broken:1 does not start: Error: crun: cgroups in hybrid" in broken.why_none()
    good = choose(SandboxConfig(image=GOOD_IMAGE))
    assert good.kind == "podman" and good.passed_over == (("bwrap", "bwrap is not installed"),)
    assert good.describe() == "sandbox=auto: podman (bwrap is not installed)"


def _podman_image() -> str | None:
    """An image podman has locally (the Debian one test_swe_env_real_repo.py builds), or None."""
    if shutil.which("podman") is None:
        return None
    from tests.test_swe_env_real_repo import IMAGE

    found = subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True, timeout=60)
    return IMAGE if found.returncode == 0 else None


@pytest.mark.slow
def test_the_real_podman_is_taken_where_bwrap_is_missing(tmp_path, monkeypatch):
    image = _podman_image()
    if image is None:
        pytest.skip("podman or its locally built image is missing (tests/test_swe_env_real_repo.py builds it)")
    podman = shutil.which("podman")
    assert podman is not None
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "podman").symlink_to(podman)
    monkeypatch.setenv("PATH", f"{bare}{os.pathsep}/usr/sbin{os.pathsep}/sbin")  # runc, iptables: podman's own
    _clear_probes()
    try:
        from slimecli.sandbox.auto import choose

        settings = SandboxConfig(image=image, container_runtime="runc")
        assert choose(settings).kind == "podman", choose(settings).describe()
    finally:
        _clear_probes()


def test_the_kind_auto_picks_is_said_and_an_explicit_kind_is_not():
    from slimecli.sandbox.auto import choose
    from slimecli.sandbox.factory import notice

    _clear_probes()
    picked = choose(SandboxConfig()).kind
    said = notice(SandboxConfig())
    if picked == "bwrap":
        assert said == ("info", "sandbox=auto: bwrap")
    assert notice(SandboxConfig(name="bwrap")) is None
    level, text = notice(SandboxConfig(name="local")) or ("", "")
    assert level == "warning" and text.startswith("sandbox=local does not isolate: ")


@pytest.mark.parametrize(("runtime", "answer", "root"), [
    ("docker", '["name=seccomp,profile=builtin","name=rootless","name=cgroupns"]', False),
    ("docker", '["name=seccomp,profile=builtin","name=cgroupns"]', True),
    ("podman", "true", False),
    ("podman", "false", True),
])
def test_a_runtime_running_containers_as_root_is_told_apart(tmp_path, runtime, answer, root):
    """As a user other than root, auto passes over a runtime whose containers run under root: what it asks."""
    from slimecli.sandbox.auto import ROOTLESS_FIELD, rootful

    client = tmp_path / runtime
    _add(tmp_path, runtime, f"#!/bin/sh\n[ \"$1 $2 $3\" = 'info --format {ROOTLESS_FIELD[runtime]}' ] || exit 2\n"
                            f"echo '{answer}'\n")
    assert rootful(runtime, str(client)) is root


def test_a_train_run_under_local_says_so_when_it_starts_and_in_its_summary(tmp_path, monkeypatch):
    """`train +recipe=swe_agent sandbox=local`, its processes stood in for by one that logs a step: the warning
    comes before anything starts, and the summary names the sandbox again."""
    import json

    from slimecli.launch import controller

    started: list[str] = []

    class OneStep:
        def __init__(self, specs, log_dir, **_kwargs) -> None:
            self.run_dir = Path(log_dir).parent

        def run(self) -> int:
            started.append("run")
            (self.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
            return 0

    monkeypatch.setattr(controller, "Supervisor", OneStep)
    out = invoke_cli("train", "+recipe=swe_agent", "sandbox=local", "trainer.max_steps=1", "observe.report=false",
                     f"run.dir={tmp_path / 'run'}")
    assert out.returncode == 0 and started == ["run"], out.stdout + out.stderr
    lines = out.stdout.splitlines()
    warned = [i for i, line in enumerate(lines) if line.startswith("warning: sandbox=local does not isolate: ")]
    directory = next(i for i, line in enumerate(lines) if line.startswith("run directory"))
    summary = next(i for i, line in enumerate(lines) if line.startswith("run summary"))
    assert len(warned) == 1 and warned[0] < directory, out.stdout  # before the run directory is even made
    [said] = [line for line in lines[summary:] if line.startswith("  sandbox      local, not isolated: ")]
    assert "reach every loopback port" in said
