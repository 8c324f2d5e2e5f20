"""Task environments: the cache key, the lock (two builders, one build), auto selection, and failures that name
the task and the field. Real git repositories and a real venv build where one is cheap; no registry."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.config.errors import ConfigErrors
from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.config.groups.task import TaskConfig
from slimecli.swe.env import resolve as env_resolve
from slimecli.swe.env import spec as env_spec
from slimecli.swe.env.resolve import EnvUnavailable, plan_task, resolve
from slimecli.swe.env.store import MANIFEST, BuildFailed, Store
from slimecli.swe.task import SweTask, parse_row
from tests.helpers import git

BWRAP = SandboxConfig(name="bwrap")
PODMAN = SandboxConfig(name="podman")


def make_repo(root: Path, files: dict[str, str]) -> tuple[Path, str]:
    root.mkdir(parents=True)
    for path, text in {"pkg.py": "X = 1\n", **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git("init", "-q", "-b", "main", ".", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "base", cwd=root)
    return root, git("rev-parse", "HEAD", cwd=root)


def make_task(repo: tuple[Path, str], **row: object) -> SweTask:
    base = {"instance_id": "t-1", "repo": "o/pkg", "base_commit": repo[1], "problem_statement": "p", "patch": "x",
            "test_patch": "y", "FAIL_TO_PASS": ["tests/test_pkg.py::test_x"], "PASS_TO_PASS": [],
            "workdir": str(repo[0])}
    parsed = parse_row({**base, **row}, "tasks.jsonl:1")
    assert isinstance(parsed, SweTask), parsed
    return parsed


DEPS = '[project]\nname = "pkg"\nversion = "1"\ndependencies = ["six"]\n'


# ---- the key ---------------------------------------------------------------------------------------------------
def test_the_key_covers_the_dependency_files_and_the_rows_install_list(tmp_path):
    one = make_task(make_repo(tmp_path / "a", {"pyproject.toml": DEPS}))
    same = make_task(make_repo(tmp_path / "b", {"pyproject.toml": DEPS, "other.py": "Y = 2\n"}), instance_id="t-2")
    changed = make_task(make_repo(tmp_path / "c", {"pyproject.toml": DEPS.replace("six", "six>=1.16")}))
    key = env_spec.read_spec(one, "pip")[0].key()
    assert env_spec.read_spec(same, "pip")[0].key() == key  # other files, other task: one venv
    assert env_spec.read_spec(changed, "pip")[0].key() != key
    assert env_spec.read_spec(replace(one, install=("attrs",)), "pip")[0].key() != key
    assert env_spec.read_spec(one, "uv")[0].key() != key
    assert env_spec.read_spec(one, "pip")[0].key() == key  # stable


def test_the_spec_reads_requirements_files_and_test_extras(tmp_path):
    pyproject = DEPS + '[project.optional-dependencies]\ntest = ["pytest-mock"]\ndocs = ["sphinx"]\n'
    repo = make_repo(tmp_path / "r", {"pyproject.toml": pyproject, "requirements-dev.txt": "attrs\n",
                                      "requirements/test.txt": "iniconfig\n", "requirements.md": "no\n"})
    spec, commit, declares = env_spec.read_spec(make_task(repo), "pip")
    assert declares and spec.project and commit == repo[1]
    assert spec.extras == ("test",)
    assert spec.requirement_files == ("requirements-dev.txt", "requirements/test.txt")
    assert [p for p, _ in spec.files] == ["pyproject.toml", "requirements-dev.txt", "requirements/test.txt"]


# ---- auto selection ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("files", "row", "sandbox", "kind"), [
    ({"pyproject.toml": "[tool.pytest.ini_options]\n"}, {}, BWRAP, "host"),
    ({"pyproject.toml": DEPS}, {}, BWRAP, "venv"),
    ({"requirements.txt": "six\n"}, {}, BWRAP, "venv"),
    ({"setup.py": "from setuptools import setup\nsetup(install_requires=['six'])\n"}, {}, BWRAP, "venv"),
    ({"setup.cfg": "[options]\ninstall_requires =\n    six\n"}, {}, BWRAP, "venv"),
    ({}, {"install": ["six"]}, BWRAP, "venv"),
    ({"pyproject.toml": DEPS}, {"image": "python:3.11-slim"}, PODMAN, "image"),
    ({"pyproject.toml": DEPS}, {"image": "python:3.11-slim"}, BWRAP, "venv"),  # no container sandbox: no image
])
def test_auto_picks_image_then_venv_then_host(tmp_path, files, row, sandbox, kind):
    task = make_task(make_repo(tmp_path / "r", files), **row)
    assert plan_task(task, TaskConfig(name="swe"), sandbox).kind == kind


def test_a_forced_kind_is_taken_and_environment_setup_commit_is_read(tmp_path):
    root, base = make_repo(tmp_path / "r", {"pyproject.toml": DEPS})
    (root / "requirements.txt").write_text("attrs\n")
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "env", cwd=root)
    env_commit = git("rev-parse", "HEAD", cwd=root)
    task = make_task((root, base))
    assert plan_task(task, TaskConfig(name="swe", environment="host"), BWRAP).kind == "host"
    chosen = plan_task(replace(task, environment_setup_commit=env_commit), TaskConfig(name="swe"), BWRAP)
    assert chosen.commit == env_commit and chosen.spec is not None
    assert chosen.spec.requirement_files == ("requirements.txt",)


@pytest.mark.parametrize(("row", "sandbox", "words"), [
    ({}, PODMAN, "names no image"),
    ({"image": "python:3.11-slim"}, BWRAP, "sandbox=bwrap"),
])
def test_an_image_environment_that_cannot_be_had_names_the_task(tmp_path, row, sandbox, words):
    task = make_task(make_repo(tmp_path / "r", {}), **row)
    with pytest.raises(EnvUnavailable) as caught:
        plan_task(task, TaskConfig(name="swe", environment="image"), sandbox)
    assert caught.value.instance_id == "t-1" and caught.value.reason == "image" and words in str(caught.value)


def test_unreadable_dependency_files_name_the_file(tmp_path):
    task = make_task(make_repo(tmp_path / "r", {"pyproject.toml": "[project\n"}))
    with pytest.raises(EnvUnavailable) as caught:
        plan_task(task, TaskConfig(name="swe"), BWRAP)
    assert caught.value.reason == "spec" and "pyproject.toml" in str(caught.value)


@pytest.mark.parametrize(("value", "words"), [(["-e", "."], "not pip options"), ([""], "pip requirement"),
                                              ({"six": 1}, "pip requirement")])
def test_a_bad_install_list_names_the_row_and_the_field(value, words):
    errors = parse_row({"instance_id": "a", "repo": "r", "base_commit": "c", "problem_statement": "p",
                        "patch": "x", "test_patch": "y", "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": [],
                        "workdir": "w", "install": value}, "f.jsonl:3")
    assert isinstance(errors, list)
    assert [(e.source, e.field) for e in errors] == [("f.jsonl:3", "install")] and words in errors[0].reason


def test_an_unknown_environment_kind_is_refused_with_the_choices():
    with pytest.raises(ConfigErrors) as caught:
        load(["task=swe", "task.environment=docker"])
    assert "task.environment" in str(caught.value) and "venv" in str(caught.value)


# ---- the store: one build per key ---------------------------------------------------------------------------------
def test_two_builders_of_one_key_build_once(tmp_path):
    store_a, store_b = Store(tmp_path), Store(tmp_path)  # two processes' stores of one cache
    calls: list[str] = []
    gate = threading.Event()

    def build(directory: Path, log: Path) -> dict:
        calls.append(directory.name)
        gate.wait(5)  # the other builder arrives while this one builds
        (directory / "bin").mkdir()
        return {"made": True}

    results: list[dict] = []
    threads = [threading.Thread(target=lambda s=s: results.append(s.ensure("venv-k", build))) for s in (store_a, store_b)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(10)
    assert calls == ["venv-k"]
    assert len(results) == 2 and all(r["made"] and r["key"] == "venv-k" for r in results)
    assert store_a.ready("venv-k") is not None


def test_an_unfinished_build_is_removed_and_built_again(tmp_path):
    store = Store(tmp_path)
    (tmp_path / "venv-k" / "junk").mkdir(parents=True)  # a build that died: no manifest
    assert store.ready("venv-k") is None
    store.ensure("venv-k", lambda d, log: {"n": len(list(d.iterdir()))})
    assert store.ready("venv-k")["n"] == 0 and not (tmp_path / "venv-k" / "junk").exists()


def test_a_failed_build_is_remembered_recorded_and_retried_on_request(tmp_path):
    store = Store(tmp_path)
    calls = []

    def broken(directory: Path, log: Path) -> dict:
        calls.append(1)
        log.write_text("pip said no\n")
        raise BuildFailed("install", "pip could not install six", log)

    for _ in range(2):
        with pytest.raises(BuildFailed, match="install: pip could not install six"):
            store.ensure("venv-k", broken)
    assert len(calls) == 1 and not (tmp_path / "venv-k").exists()
    assert "pip could not install six" in (Store(tmp_path).last_failure("venv-k") or "")  # another process sees it
    store.ensure("venv-k", lambda d, log: {}, retry=True)
    assert store.last_failure("venv-k") is None and store.ready("venv-k") is not None


def test_a_full_disk_is_a_build_failure_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr("slimecli.swe.env.store.MIN_FREE_MB", 1 << 40)
    with pytest.raises(BuildFailed) as caught:
        Store(tmp_path).ensure("venv-k", lambda d, log: {})
    assert caught.value.reason == "disk" and "full" in caught.value.detail


def test_list_and_prune(tmp_path):
    store = Store(tmp_path)
    for key in ("venv-a", "venv-b"):
        store.ensure(key, lambda d, log: (d / "f").write_bytes(b"x" * 1000) and {})
    assert [(e.key, e.size_bytes > 1000) for e in store.entries()] == [("venv-a", True), ("venv-b", True)]
    assert store.prune(["venv-a"]) == ["venv-a"] and [e.key for e in store.entries()] == ["venv-b"]
    assert store.prune() == ["venv-b"] and store.entries() == []


# ---- building, and failing to, for real -------------------------------------------------------------------------
@pytest.mark.slow  # a built-in task checked beside it
def test_a_row_whose_requirement_cannot_be_installed_is_unevaluatable_env_with_its_log(tmp_path, monkeypatch):
    from slimecli.swe.check import check_all
    from slimecli.swe.env.resolve import grading_sandboxes

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing is fetched: the requirement is a path that is not there
    from slimecli.swe.task import load as load_tasks

    missing = str(tmp_path / "no-such-package")
    task = make_task(make_repo(tmp_path / "r", {}), install=[missing])
    settings = TaskConfig(name="swe", env_dir=str(tmp_path / "envs"))
    good = load_tasks("builtin:swe_tiny").tasks[0]  # checked in the same run: it goes on
    result, other = asyncio.run(check_all([task, good], sandboxes_for=lambda t: grading_sandboxes(t, settings, BWRAP)))
    assert other.ok, other.why
    assert not result.ok and [c.name for c in result.checks] == ["env"]
    assert result.why.startswith("env: unevaluatable:env:install: ") and "build log: " in result.why
    log = Path(result.why.rsplit("build log: ", 1)[1].rstrip(")"))
    assert missing in log.read_text()
    with pytest.raises(EnvUnavailable) as caught:  # remembered: no second build for the next task of that key
        resolve(replace(task, instance_id="t-2"), settings, BWRAP)
    assert caught.value.instance_id == "t-2" and caught.value.reason == "install"


def test_preflight_names_each_task_whose_environment_cannot_be_built(tmp_path, monkeypatch):
    from slimecli.launch.agent_checks import task_env_errors

    monkeypatch.setattr(env_resolve, "host_has_runner", lambda: False)  # a plain install: host needs a runner venv
    rows = tmp_path / "tasks.jsonl"
    repo = make_repo(tmp_path / "r", {})
    row = {"instance_id": "t-1", "repo": "o/pkg", "base_commit": repo[1], "problem_statement": "p", "patch": "x",
           "test_patch": "y", "FAIL_TO_PASS": ["tests/test_pkg.py::test_x"], "PASS_TO_PASS": [],
           "workdir": str(repo[0])}
    rows.write_text(json.dumps(row) + "\n" + json.dumps({**row, "instance_id": "t-2", "install": ["six"]}) + "\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = load(["task=swe", f"task.path={rows}", f"task.env_dir={blocker}/envs"])
    errors = task_env_errors(cfg)
    assert [e.path for e in errors] == ["task.environment", "task.environment"]
    assert "task t-1: host environment runner-" in errors[0].reason and "cannot create" in errors[0].reason
    assert "task t-2: venv environment venv-" in errors[1].reason and "tasks env build" in errors[1].hint
    ok = load(["task=swe", f"task.path={rows}", f"task.env_dir={tmp_path}/envs"])
    assert task_env_errors(ok) == []
    store = env_resolve.store_for(ok.task)
    key = env_resolve.host_spec(ok.task).key()
    store.log(key).parent.mkdir(parents=True)
    (store.log(key).parent / f"{key}.failed").write_text("install: no network\n")
    [error] = task_env_errors(replace(ok, task=replace(ok.task, instance="t-1")))
    assert "task t-1" in error.reason and "last build failed: install: no network" in error.reason


def test_a_host_task_without_a_runner_gets_a_cached_runner_venv(tmp_path, monkeypatch):
    """A plain install (no pytest in slimecli's interpreter): host tasks grade in a venv holding only the runner.
    Offline here: the install step links this interpreter's site-packages (where pytest is) into the new venv."""
    import pytest as runner

    site = Path(runner.__file__).resolve().parent.parent

    def link_site(self, requirements: list[str], report: Path | None) -> None:
        assert requirements == ["pytest"]
        [lib] = (self.venv / "lib").glob("python3*")
        (lib / "site-packages" / "host.pth").write_text(f"{site}\n")

    monkeypatch.setattr(env_resolve, "host_has_runner", lambda: False)
    monkeypatch.setattr("slimecli.swe.env.build.Installer.install", link_site)
    task = make_task(make_repo(tmp_path / "r", {}))
    settings = TaskConfig(name="swe", env_dir=str(tmp_path / "envs"))
    env = resolve(task, settings, BWRAP)
    assert env.kind == "host" and env.key is not None and env.key.startswith("runner-")
    assert env.ro_paths == (str((tmp_path / "envs" / env.key).resolve()),)
    manifest = json.loads((Path(env.ro_paths[0]) / MANIFEST).read_text())
    assert manifest["runner"].startswith("pytest ") and manifest["for"] == "t-1"
    again = resolve(replace(task, instance_id="t-2"), settings, BWRAP)  # warm: the same directory, no build
    assert again.bin_dir == env.bin_dir


def test_tasks_env_list_and_prune_commands(tmp_path):
    from tests.helpers import invoke_cli

    store = Store(tmp_path / "envs")
    store.ensure("venv-a", lambda d, log: {"runner": "pytest 9", "for": "t-1"})
    store.ensure("venv-b", lambda d, log: {"runner": "pytest 9", "for": "t-2"})
    where = f"task.env_dir={tmp_path / 'envs'}"
    listed = invoke_cli("tasks", "env", "list", where, "--json")
    assert listed.returncode == 0 and [json.loads(line)["key"] for line in listed.stdout.splitlines()] == ["venv-a",
                                                                                                          "venv-b"]
    unknown = invoke_cli("tasks", "env", "prune", "venv-zz", where)
    assert unknown.returncode == 2 and "no cached environment venv-zz" in unknown.stderr
    assert invoke_cli("tasks", "env", "prune", "venv-a", where).returncode == 0
    assert [e.key for e in store.entries()] == ["venv-b"]
    assert invoke_cli("tasks", "env", "prune", where).returncode == 0 and store.entries() == []


FAKE_RUNTIME = """#!/bin/sh
case "$1 $2" in
  "info --format") echo amd64 ;;
  "image inspect") [ "$3" = localhost/there:1 ] ;;
  "pull -q") echo "Error: initializing source docker://$3: no registry reachable" >&2; exit 125 ;;
  *) exit 2 ;;
esac
"""


def test_a_missing_image_and_a_missing_runtime_name_the_task_and_the_field(tmp_path):
    client = tmp_path / "podman"
    client.write_text(FAKE_RUNTIME)
    client.chmod(0o755)
    repo = make_repo(tmp_path / "r", {})
    settings, sandbox = TaskConfig(name="swe", environment="image"), SandboxConfig(name="podman", binary=str(client))
    assert resolve(make_task(repo, image="localhost/there:1"), settings, sandbox).image == "localhost/there:1"
    with pytest.raises(EnvUnavailable) as caught:
        resolve(make_task(repo, instance_id="t-2", image="localhost/gone:1"), settings, sandbox)
    assert caught.value.instance_id == "t-2" and caught.value.reason == "image"
    assert "field image: the image localhost/gone:1 is not among podman's local images" in str(caught.value)
    assert "cannot be pulled: Error: initializing source" in str(caught.value)
    absent = SandboxConfig(name="podman", binary=str(tmp_path / "no-podman"))
    with pytest.raises(EnvUnavailable) as caught:
        resolve(make_task(repo, instance_id="t-3", image="localhost/there:1"), settings, absent)
    assert caught.value.instance_id == "t-3" and f"sandbox=podman: {tmp_path}/no-podman is not installed" in str(
        caught.value)
