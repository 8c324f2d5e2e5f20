"""The built-in swe_tiny set: every task valid under plain git + pytest, base commits rebuilt to the stored
SHAs (once, also under concurrent callers), workspaces that hide the fix, and a task file the builder
reproduces byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slimecli.swe.builtin import list_sets, materialize, task_file
from slimecli.swe.task import SweTask, TaskFileError, load
from slimecli.swe.workspace import WorkspaceError, prepare

ROOT = Path(__file__).resolve().parent.parent
TASKS = load("builtin:swe_tiny").tasks
BY_ID = {t.instance_id: t for t in TASKS}
REPOS = sorted({t.workdir.removeprefix("builtin:") for t in TASKS if t.workdir})
STAMP = "slimecli swe_tiny <swe-tiny@slimecli.invalid> 1704067200 +0000"


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


def git(*args: str, cwd: Path | None = None, input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, input=input.encode() if input else None, capture_output=True,
                          env=git_env())
    if check:
        assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr.decode(errors='replace')}"
    return proc.stdout.decode(errors="replace")  # trees are binary


def pytest_proc(workdir: Path) -> subprocess.Popen:
    """`python -m pytest -rA` in a task repository, without this run's plugins (they cost seconds to load)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    return subprocess.Popen([sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider"],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def outcomes(proc: subprocess.Popen) -> dict[str, str]:
    """node id -> PASSED / FAILED / ERROR, from the short test summary that -rA prints."""
    out, _ = proc.communicate(timeout=120)
    result: dict[str, str] = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            result[rest.split(" - ")[0]] = word
    assert result, out
    return result


def added_fix_lines(task: SweTask, workspace: Path) -> list[str]:
    """Lines the gold patch adds that the base tree lacks: what would show that the fix leaked."""
    present = {line for path in workspace.rglob("*.py") if ".git" not in path.parts
               for line in path.read_text().splitlines()}
    return [line[1:] for line in task.patch.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip() and line[1:] not in present]


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLIMECLI_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def test_the_set_has_enough_tasks_over_enough_repos():
    tasks = load("builtin:swe_tiny")
    assert tasks.errors == []
    assert len(tasks.tasks) >= 16 and len(REPOS) >= 4
    kinds = [t.extra["kind"] for t in tasks.tasks]
    assert 3 <= kinds.count("feature") <= 4 and len(set(kinds)) >= 8
    for t in tasks.tasks:
        assert 1 <= len(t.fail_to_pass) <= 3 and 3 <= len(t.pass_to_pass) <= 10, t.instance_id
        assert not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert t.repo == f"slimecli/swe_tiny-{t.workdir.removeprefix('builtin:')}" and t.version == "1.0"
    (info,) = [s for s in list_sets() if s["name"] == "swe_tiny"]
    assert info["tasks"] == len(tasks.tasks) and sorted(info["repos"]) == REPOS
    assert Path(info["path"]) == task_file("swe_tiny")


def test_an_unknown_set_names_the_available_ones():
    with pytest.raises(TaskFileError, match="builtin:swe_tiny"):
        load("builtin:no_such_set")
    with pytest.raises(TaskFileError, match="calc"):
        materialize("swe_tiny", "no_such_repo")


def test_materialize_rebuilds_the_stored_root_commits_once():
    for repo in REPOS:
        path = materialize("swe_tiny", repo)
        inode = path.stat().st_ino
        assert materialize("swe_tiny", repo) == path and path.stat().st_ino == inode  # not rebuilt
        refs = dict(line.split() for line in git("--git-dir", str(path), "for-each-ref",
                                                 "--format=%(refname) %(objectname)").splitlines())
        assert refs == {f"refs/heads/swe/{t.instance_id}": t.base_commit for t in TASKS if t.workdir == f"builtin:{repo}"}
        for sha in refs.values():
            header = git("--git-dir", str(path), "cat-file", "commit", sha).split("\n\n")[0].splitlines()
            assert [line.split()[0] for line in header] == ["tree", "author", "committer"]  # no parent
            assert header[1] == f"author {STAMP}" and header[2] == f"committer {STAMP}"
            modes = {line.split()[0] for line in git("--git-dir", str(path), "ls-tree", "-r", sha).splitlines()}
            assert modes == {"100644"}


def test_a_stale_cache_is_rebuilt(tmp_path):
    path = materialize("swe_tiny", "calc", cache_dir=tmp_path)
    git("--git-dir", str(path), "update-ref", "-d", "refs/heads/swe/tiny-calc-002")
    git("--git-dir", str(path), "update-ref", "refs/heads/swe/tiny-calc-003", BY_ID["tiny-calc-001"].base_commit)
    assert materialize("swe_tiny", "calc", cache_dir=tmp_path) == path
    assert git("--git-dir", str(path), "rev-parse", "swe/tiny-calc-002", "swe/tiny-calc-003").split() == [
        BY_ID["tiny-calc-002"].base_commit, BY_ID["tiny-calc-003"].base_commit]


def _refs_and_leftovers(path: Path) -> tuple[str, list[str]]:
    return git("--git-dir", str(path), "for-each-ref"), sorted(p.name for p in path.parent.iterdir())


def test_concurrent_materialize_from_processes_and_threads(tmp_path):
    code = "import sys; from slimecli.swe.builtin import materialize; print(materialize('swe_tiny', 'wrap', sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "p")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(4)]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    paths = {Path(out.strip()) for out, _ in results}
    threads_out: list[Path] = []
    threads = [threading.Thread(target=lambda: threads_out.append(materialize("swe_tiny", "wrap", tmp_path / "t")))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(paths) == 1 and len(set(threads_out)) == 1 and len(threads_out) == 4
    by_procs, by_threads = _refs_and_leftovers(paths.pop()), _refs_and_leftovers(threads_out[0])
    assert by_procs == by_threads and by_procs[1] == [".wrap.git.lock", "wrap.git"]  # no temp dir left behind
    assert by_procs[0].count("refs/heads/swe/tiny-wrap-") == 4


def test_the_callers_git_settings_change_nothing(tmp_path, monkeypatch):
    hostile = tmp_path / "gitconfig"
    hostile.write_text("[init]\n\tdefaultObjectFormat = sha256\n\tdefaultBranch = trunk\n[commit]\n\tgpgsign = true\n"
                       "[core]\n\tautocrlf = true\n[user]\n\tname = someone\n")
    for key, value in {"GIT_CONFIG_GLOBAL": str(hostile), "GIT_DIR": str(tmp_path / "nowhere"),
                       "GIT_AUTHOR_DATE": "2001-01-01T00:00:00", "GIT_COMMITTER_NAME": "x", "HOME": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / ".gitconfig").write_text(hostile.read_text())
    path = materialize("swe_tiny", "lru", cache_dir=tmp_path / "cache")
    task = BY_ID["tiny-lru-003"]
    (tmp_path / "ws").mkdir()
    prepare(task, tmp_path / "ws")
    for var in ("GIT_CONFIG_GLOBAL", "GIT_DIR", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME"):
        monkeypatch.delenv(var)
    assert git("--git-dir", str(path), "rev-parse", "swe/tiny-lru-003").strip() == task.base_commit
    assert git("rev-parse", "HEAD", cwd=tmp_path / "ws").strip() == task.base_commit
    assert git("config", "user.name", cwd=tmp_path / "ws").strip() == "slimecli agent"


@pytest.mark.parametrize("instance_id", sorted(BY_ID))
def test_task_fails_at_base_and_passes_with_the_gold_patch(instance_id, tmp_path):
    task = BY_ID[instance_id]
    base, gold = tmp_path / "base", tmp_path / "gold"
    base.mkdir()
    prepare(task, base)
    shutil.copytree(base, gold)
    for workdir, patches in ((base, [task.test_patch]), (gold, [task.patch, task.test_patch])):
        for patch in patches:
            git("apply", "-", cwd=workdir, input=patch)
    before_proc, after_proc = pytest_proc(base), pytest_proc(gold)  # both at once: half the wall time
    before, after = outcomes(before_proc), outcomes(after_proc)
    assert {t: before.get(t) for t in task.fail_to_pass} == dict.fromkeys(task.fail_to_pass, "FAILED")
    assert {t for t, v in before.items() if v != "PASSED"} == set(task.fail_to_pass)  # P2P and all others pass
    assert set(task.pass_to_pass) <= set(before)
    assert set(task.tests) <= set(after) and set(after.values()) == {"PASSED"}


def test_patches_are_accepted_by_git_apply_3way_and_patch(tmp_path):
    if shutil.which("patch") is None:
        pytest.skip("no `patch` program on this machine")
    for task in TASKS:
        work = tmp_path / task.instance_id
        work.mkdir()
        prepare(task, work)
        for patch in (task.patch, task.test_patch):
            git("apply", "--check", "--3way", "-", cwd=work, input=patch)
            proc = subprocess.run(["patch", "-p1", "--dry-run", "--batch"], cwd=work, input=patch, text=True,
                                  capture_output=True)
            assert proc.returncode == 0, (task.instance_id, proc.stdout, proc.stderr)


@pytest.mark.parametrize("instance_id", sorted(BY_ID))
def test_workspace_holds_the_base_commit_and_nothing_that_leads_to_the_fix(instance_id, tmp_path):
    task = BY_ID[instance_id]
    prepare(task, tmp_path)
    assert git("rev-list", "--all", cwd=tmp_path).split() == [task.base_commit]
    assert git("log", "--all", "--format=%H", cwd=tmp_path).split() == [task.base_commit]
    assert git("rev-parse", "HEAD", cwd=tmp_path).strip() == task.base_commit
    assert git("remote", cwd=tmp_path) == "" and git("status", "--porcelain", cwd=tmp_path) == ""
    assert git("reflog", "--all", cwd=tmp_path, check=False).strip() == ""
    assert not (tmp_path / ".git" / "FETCH_HEAD").exists()
    assert git("config", "user.email", cwd=tmp_path).strip() and git("config", "user.name", cwd=tmp_path).strip()
    object_lines = set(git("cat-file", "--batch-all-objects", "--batch", cwd=tmp_path).splitlines())
    fix = added_fix_lines(task, tmp_path)
    assert fix and not [line for line in fix if line in object_lines]
    fixed_blobs = {line.split()[1].split("..")[1] for line in task.patch.splitlines() if line.startswith("index ")}
    ids = set(git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=tmp_path).split())
    assert fixed_blobs and not fixed_blobs & ids
    for test_id in task.fail_to_pass:
        assert not (tmp_path / test_id.split("::")[0]).exists()


def test_a_local_repository_gives_only_the_asked_commit(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    git("init", "-q", ".", cwd=src)
    for text in ("one\n", "two\n", "three: the fix\n"):
        (src / "f.txt").write_text(text)
        git("add", "f.txt", cwd=src)
        git(*ident, "commit", "-q", "-m", text, cwd=src)
    middle = git("rev-parse", "HEAD~1", cwd=src).strip()
    task = SweTask("local-1", "me/x", middle[:10], "p", "patch", "test", ("t",), (), workdir=str(src))
    prepare(task, dest)
    assert (dest / "f.txt").read_text() == "two\n"
    assert git("rev-list", "--all", cwd=dest).split() == [middle]
    assert git("remote", cwd=dest) == "" and "the fix" not in git("cat-file", "--batch-all-objects", "--batch",
                                                                  cwd=dest)


def _task(workdir: str, commit: str) -> SweTask:
    return SweTask("t-1", "me/x", commit, "p", "patch", "test", ("t",), (), workdir=workdir)


def test_prepare_errors_say_what_is_wrong(tmp_path):
    def fails(task: SweTask, match: str) -> None:
        dest = tmp_path / f"dest{len(list(tmp_path.iterdir()))}"
        dest.mkdir()
        with pytest.raises(WorkspaceError, match=match):
            prepare(task, dest)
        assert list(dest.iterdir()) == []

    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    git("init", "-q", ".", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x", cwd=repo)
    calc = BY_ID["tiny-calc-001"]
    fails(_task("builtin:no_such_repo", calc.base_commit), "no built-in repository")
    fails(_task("builtin:calc", "0" * 40), "commit 0{40} not found in builtin:calc")
    fails(_task(str(tmp_path / "missing"), "HEAD"), "no such directory")
    fails(_task(str(repo / "sub"), "HEAD"), "not a git repository")  # never the repository above it
    fails(_task(str(repo), calc.base_commit), "not found in workdir")
    fails(_task(str(repo), "--help"), "not found in workdir")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    with pytest.raises(WorkspaceError, match="not empty"):
        prepare(calc, busy)


def test_the_builder_reproduces_the_shipped_task_file(tmp_path):
    out = tmp_path / "tasks.jsonl"
    proc = subprocess.run([sys.executable, "-m", "tools.tiny_build", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == task_file("swe_tiny").read_bytes()


def test_a_regenerating_tool_writes_checks_and_reports_a_failed_build(tmp_path, capsys):
    """tools/regen.py, the command line of tiny_build and smoke_build: --check exits 1 on a stale file, a build
    that fails exits 2 naming the tool, and a write makes the folder."""
    from tools.regen import regen_main

    out = tmp_path / "new" / "tasks.jsonl"
    assert regen_main("t", "doc", out, lambda: b"a\nb\n", ValueError, "the specs", ["--check"]) == 1
    assert "differs from the specs (regenerate it)" in capsys.readouterr().err
    assert regen_main("t", "doc", out, lambda: b"a\nb\n", ValueError, "the specs", []) == 0
    assert out.read_bytes() == b"a\nb\n" and "2 tasks" in capsys.readouterr().err
    assert regen_main("t", "doc", tmp_path / "x", lambda: b"", ValueError, "s", ["--out", str(out), "--check"]) == 1
    assert regen_main("t", "doc", out, lambda: b"a\nb\n", ValueError, "the specs", ["--check"]) == 0

    def broken() -> bytes:
        raise ValueError("spec calc.toml: no edits")

    assert regen_main("t", "doc", out, broken, ValueError, "the specs", []) == 2
    assert "t: spec calc.toml: no edits" in capsys.readouterr().err
