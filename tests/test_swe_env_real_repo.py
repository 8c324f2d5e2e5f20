"""A repository nobody here wrote: isodate 0.6.1's released sdist (it ships its tests and needs `six`, which
slimecli's interpreter lacks), one function broken by hand, its tests as FAIL_TO_PASS. The task's venv is built
from the repository's own setup.py, and grading runs in it: `tasks check` passes, the gold patch resolves, the
empty patch does not, and the real Claude Code CLI works on it. The sdist is downloaded once into the cache
directory and reused. The same task as an `image` row runs in rootful podman (runc) in a Debian image built
locally once (mmdebstrap + podman import; there is no registry to pull from) and kept in podman's storage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from slimecli.swe.builtin import cache_root
from slimecli.swe.check import file_diff
from tests.helpers import ROOT, free_port, git, invoke_cli, run_cli

pytestmark = pytest.mark.slow

SDIST = "isodate-0.6.1"
BROKEN_FILE = "src/isodate/duration.py"
GOOD = "negduration = Duration(years=-self.years, months=-self.months)"
BAD = "negduration = Duration(years=self.years, months=-self.months)"  # the years keep their sign
TEST_FILE = "src/isodate/tests/test_duration.py"
F2P = [f"{TEST_FILE}::DurationTest::test_neg", f"{TEST_FILE}::DurationTest::test_format"]
P2P = [f"{TEST_FILE}::DurationTest::{name}" for name in ("test_repr", "test_hash", "test_equal", "test_totimedelta")]


def sdist() -> Path:
    """The released sdist, from the cache, else from the registry (skip, with the reason, if it cannot be reached)."""
    where = cache_root() / "test-sdists"
    archive = where / f"{SDIST}.tar.gz"
    if archive.is_file():
        return archive
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                           "--disable-pip-version-check", "-d", str(where), SDIST.replace("-", "==")],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not archive.is_file():
        pytest.skip(f"the package registry cannot be reached to download {SDIST}: {proc.stderr.strip()[-300:]}")
    return archive


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("isodate")
    with tarfile.open(sdist()) as tar:
        tar.extractall(tmp, filter="data")
    repo = tmp / SDIST
    shutil.rmtree(repo / "src" / "isodate.egg-info")
    source = (repo / BROKEN_FILE).read_text()
    assert GOOD in source
    tests = (repo / TEST_FILE).read_text()
    (repo / BROKEN_FILE).write_text(source.replace(GOOD, BAD))
    (repo / TEST_FILE).unlink()  # the hidden tests: the test patch adds them back
    git("init", "-q", "-b", "main", ".", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "isodate 0.6.1, Duration.__neg__ broken", cwd=repo)
    row = {"instance_id": "isodate-neg", "repo": "gweis/isodate", "base_commit": git("rev-parse", "HEAD", cwd=repo),
           "problem_statement": "-Duration(years=1) keeps a positive year: unary minus does not negate the years.",
           "patch": file_diff(BROKEN_FILE, source.replace(GOOD, BAD), source),
           "test_patch": file_diff(TEST_FILE, None, tests), "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P,
           "workdir": str(repo)}
    path = tmp / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (tmp / "gold.diff").write_text(row["patch"])
    (tmp / "empty.diff").write_text("")
    return path


def session_envs(factory: pytest.TempPathFactory) -> Path:
    """The task.env_dir of every isodate test in this session, across xdist workers: its venv (the same
    dependencies, the same key) is built once, by the first that needs it (the store locks the key)."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above each worker's own
    path = root / "isodate-envs"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_envs(tmp_path_factory)


def test_a_released_repository_is_graded_in_its_own_venv(task_file, envs):
    args = [f"task.path={task_file}", f"task.env_dir={envs}"]
    built = invoke_cli("tasks", "env", "build", *args)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "ok   isodate-neg: venv venv-" in built.stdout and "declares dependencies" in built.stdout
    venv = envs / built.stdout.split("ok   isodate-neg: venv ", 1)[1].split()[0].split("/")[-1]
    assert venv.is_dir(), built.stdout
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import six, pytest\ntry:\n import isodate\n"
                            "except ImportError: print('no project')"], capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() == "no project", probe.stderr  # deps in, project out

    checked = invoke_cli("tasks", "check", *args, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = json.loads(checked.stdout)
    assert result["ok"] and {c["name"] for c in result["checks"]} >= {"base", "gold", "empty_diff"}

    for patch, resolved in (("gold.diff", 1), ("empty.diff", 0)):
        graded = invoke_cli("tasks", "grade", *args, "task.instance=isodate-neg", "--patch",
                            str(task_file.parent / patch))
        assert graded.returncode == 0, graded.stderr
        assert json.loads(graded.stdout)["resolved"] == resolved, (patch, graded.stdout)

    listed = invoke_cli("tasks", "env", "list", *args)
    assert venv.name in listed.stdout and "environment(s)" in listed.stderr


def claude_code_run(task_file: Path, tmp_path: Path, command: str, *extra: str) -> dict:
    """`agent run` of the real Claude Code CLI on the task, its one tool call running `command` then applying the
    gold patch; the sample it wrote."""
    import base64
    import time
    import urllib.request

    from slimecli.agent.harness.install import locate
    from slimecli.config.groups.model import ModelConfig
    from slimecli.model.loading import resolve_model_path

    if locate("claude_code") is None:
        pytest.skip("the claude_code CLI is not installed: run `slimecli agent install claude_code` (CI does)")
    row = json.loads(task_file.read_text())
    apply = f"printf %s {base64.b64encode(row['patch'].encode()).decode()} | base64 -d | git apply"
    call = {"name": "Bash", "arguments": {"command": f"{command} && {apply}", "description": "fix"}}
    script = tmp_path / "script.json"
    script.write_text(json.dumps([f"<tool_call>\n{json.dumps(call)}\n</tool_call>", "Fixed."]))
    tiny, port = str(resolve_model_path(ModelConfig())), free_port()
    engine = subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "scripted_engine.py"), "--model", tiny,
                               "--port", str(port), "--script", str(script)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the scripted engine did not start"
                time.sleep(0.2)
        out = tmp_path / "samples.jsonl"
        proc = run_cli("agent", "run", "agent=claude_code", "task=swe", f"task.path={task_file}",
                       "task.instance=isodate-neg", f"model.path={tiny}", f"agent.engine_url=http://127.0.0.1:{port}",
                       f"agent.output={out}", *extra, timeout=300)
    finally:
        engine.terminate()
        engine.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [sample] = [json.loads(line) for line in out.read_text().splitlines()]
    return sample


def test_the_real_claude_code_cli_works_on_it_in_the_same_venv(task_file, envs, tmp_path):
    """`agent run` with the real Claude Code CLI under the sandbox: its one tool call imports the repository's
    dependency (only the task's venv has it) and then applies the fix; the diff is graded in that venv."""
    sample = claude_code_run(task_file, tmp_path, "python -c 'import six'", f"task.env_dir={envs}")
    assert sample["metadata"]["environment"]["kind"] == "venv", sample["metadata"]
    assert sample["reward"]["resolved"] == 1, (sample["reward"], sample["metadata"].get("diff"))
    assert "duration.py" in sample["metadata"]["diff"]


# ---- the same task in a container image ------------------------------------------------------------------------
IMAGE_PACKAGES = ("python3", "python3-pytest", "python3-six", "git", "python-is-python3", "nodejs")  # node: the CLI
IMAGE = "localhost/slimecli-test-isodate:" + __import__("hashlib").sha256(",".join(IMAGE_PACKAGES).encode()).hexdigest()[:12]
PODMAN = ("sandbox=podman", "sandbox.container_runtime=runc")  # crun cannot run where cgroup v1 and v2 are mixed


def _podman_problem() -> str | None:
    """None when podman, runc and mmdebstrap are here (installing them with apt where they are not)."""
    if all(shutil.which(b) for b in ("podman", "runc", "mmdebstrap")):
        return None
    if os.getuid() != 0 or shutil.which("apt-get") is None:
        return "podman cannot be installed here (needs root and apt-get): apt-get install podman runc mmdebstrap"
    proc = subprocess.run(["apt-get", "install", "-y", "podman", "runc", "mmdebstrap"], capture_output=True, text=True,
                          timeout=600)
    return None if proc.returncode == 0 else f"podman cannot be installed here: {proc.stderr.strip()[-300:]}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Debian image with python, pytest, six and git, built from the Debian archive once per machine."""
    why = _podman_problem()
    if why:
        pytest.skip(why)
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode == 0:
        return IMAGE
    rootfs = tmp_path_factory.mktemp("image") / "rootfs.tar"
    built = subprocess.run(["mmdebstrap", "--variant=apt", f"--include={','.join(IMAGE_PACKAGES)}", "bookworm",
                            str(rootfs)], capture_output=True, text=True, timeout=900)
    if built.returncode != 0:
        pytest.skip(f"the Debian archive cannot be reached to build the image: {built.stderr.strip()[-300:]}")
    imported = subprocess.run(["podman", "import", "-q", str(rootfs), IMAGE], capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    return IMAGE


@pytest.fixture(scope="module")
def image_task_file(task_file: Path, image: str) -> Path:
    path = task_file.parent / "image-tasks.jsonl"
    path.write_text(json.dumps({**json.loads(task_file.read_text()), "image": image}) + "\n")
    return path


def test_the_task_as_an_image_row_is_graded_in_podman(image_task_file):
    checked = invoke_cli("tasks", "check", f"task.path={image_task_file}", *PODMAN, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["ok"]
    graded = invoke_cli("tasks", "grade", f"task.path={image_task_file}", *PODMAN, "task.instance=isodate-neg",
                        "--patch", str(image_task_file.parent / "gold.diff"))
    assert graded.returncode == 0 and json.loads(graded.stdout)["resolved"] == 1, graded.stdout + graded.stderr


def test_the_real_claude_code_cli_works_on_the_image_row_in_podman(image_task_file, tmp_path):
    sample = claude_code_run(image_task_file, tmp_path, "python -c 'import six'", *PODMAN)  # the image's python
    assert sample["metadata"]["environment"]["kind"] == "image" and sample["metadata"]["sandbox"] == "podman"
    assert sample["reward"]["resolved"] == 1, (sample["reward"], sample["metadata"].get("error"))
