"""The task sets shipped with slimecli (`builtin:NAME`), and their repositories, built as git history on demand.

A set lives in data/<set>/: tasks.jsonl (the rows, written by `python -m tools.tiny_build`) and
repos/<repo>/, each repository's clean (fixed) source tree. No git history ships: a task's base commit is
the clean tree with the gold patch reversed, committed as a root commit with a fixed author, date and
message, so `materialize` rebuilds on any machine the very SHA the row names, and checks that it did.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from slimecli.swe.git import GitError, run_git
from slimecli.swe.rows import BUILTIN_PREFIX, SweTask, TaskFileError
from slimecli.swe.sets import DATA_DIR as DATA_DIR
from slimecli.swe.sets import SETS as SETS
from slimecli.swe.sets import task_file as task_file
from slimecli.swe.task import load

CACHE_ENV = "SLIMECLI_CACHE"  # replaces ~/.cache/slimecli as the cache root
# Everything that goes into a base commit's SHA besides its tree: fixed, so the SHA is the same everywhere.
COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "slimecli swe_tiny", "GIT_AUTHOR_EMAIL": "swe-tiny@slimecli.invalid",
    "GIT_AUTHOR_DATE": "1704067200 +0000",
    "GIT_COMMITTER_NAME": "slimecli swe_tiny", "GIT_COMMITTER_EMAIL": "swe-tiny@slimecli.invalid",
    "GIT_COMMITTER_DATE": "1704067200 +0000",
}
COMMIT_MESSAGE = b"Initial commit\n"
FILE_MODE = "100644"
SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache"})


def set_tasks(name: str) -> list[SweTask]:
    """The rows of a built-in set; a bad row is a broken installation, not something to skip."""
    tasks = load(str(task_file(name)))
    if tasks.errors:
        raise TaskFileError(f"{BUILTIN_PREFIX}{name}: {tasks.errors[0].render()}")
    return tasks.tasks


def _repos(tasks: list[SweTask]) -> list[str]:
    return list(dict.fromkeys(t.workdir[len(BUILTIN_PREFIX):] for t in tasks
                              if t.workdir and t.workdir.startswith(BUILTIN_PREFIX)))


def list_sets() -> list[dict[str, Any]]:
    """One dict per built-in set: name, description, tasks (how many), repos (their names), path (the file)."""
    out = []
    for name, description in SETS.items():
        tasks = set_tasks(name)
        out.append({"name": name, "description": description, "tasks": len(tasks), "repos": _repos(tasks),
                    "path": str(task_file(name))})
    return out


def _valid_repo_name(repo: str) -> bool:
    return bool(repo) and "/" not in repo and "\\" not in repo and repo not in (".", "..")


def repo_dir(set_name: str, repo: str) -> Path:
    """The clean source tree of one repository of a set."""
    root = task_file(set_name).parent / "repos"
    path = root / repo
    if not _valid_repo_name(repo) or not path.is_dir():
        names = ", ".join(sorted(p.name for p in root.iterdir() if p.is_dir()))
        raise TaskFileError(f"{BUILTIN_PREFIX}{set_name}: no repository {repo!r} (it has: {names})")
    return path


def locate(repo: str) -> str | None:
    """The first built-in set that has a repository named `repo` (what `workdir: builtin:REPO` means)."""
    if not _valid_repo_name(repo):
        return None
    return next((name for name in SETS if (DATA_DIR / name / "repos" / repo).is_dir()), None)


def repo_files(root: Path) -> dict[str, bytes]:
    """Every file of a source tree by its POSIX path, minus what running Python or its tests leaves behind."""
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not SKIPPED_DIRS.intersection(rel.parts) and path.suffix != ".pyc":
            files[rel.as_posix()] = path.read_bytes()
    return files


def write_tree(git_dir: Path, files: dict[str, bytes], home: str) -> str:
    """The tree object of `files` (all mode 100644), written into the repository."""
    entries = []
    for path, data in sorted(files.items()):
        blob = run_git("--git-dir", str(git_dir), "hash-object", "-w", "--no-filters", "--stdin", input=data,
                       home=home)
        entries.append(f"{FILE_MODE} blob {blob}\t{path}\n")
    index = {"GIT_INDEX_FILE": str(git_dir / "slimecli-tree-index")}
    try:
        run_git("--git-dir", str(git_dir), "update-index", "--add", "--index-info", input="".join(entries).encode(),
                home=home, env=index)
        return run_git("--git-dir", str(git_dir), "write-tree", home=home, env=index)
    finally:
        Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)


def commit_tree(git_dir: Path, tree: str, home: str) -> str:
    """A root commit of `tree` with the fixed identity, date and message: the same SHA for the same tree."""
    return run_git("--git-dir", str(git_dir), "commit-tree", tree, input=COMMIT_MESSAGE, home=home, env=COMMIT_ENV)


def base_tree(git_dir: Path, clean_tree: str, gold_patch: str, home: str) -> str:
    """The clean tree with the gold patch reversed: the tree the task starts from."""
    index = {"GIT_INDEX_FILE": str(git_dir / "slimecli-base-index")}
    try:
        run_git("--git-dir", str(git_dir), "read-tree", clean_tree, home=home, env=index)
        run_git("--git-dir", str(git_dir), "apply", "--cached", "-R", input=gold_patch.encode(), home=home, env=index)
        return run_git("--git-dir", str(git_dir), "write-tree", home=home, env=index)
    finally:
        Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)


def cache_root() -> Path:
    """$SLIMECLI_CACHE, else the cache directory the tiny model uses."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    from slimecli.model.loading import default_cache_dir

    return default_cache_dir()


def _refs(git_dir: Path, home: str) -> dict[str, str] | None:
    if not (git_dir / "HEAD").is_file():
        return None
    try:
        out = run_git("--git-dir", str(git_dir), "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/swe/",
                      home=home)
    except GitError:
        return None
    return dict(line.split(" ", 1) for line in out.splitlines())


def _build(git_dir: Path, set_name: str, repo: str, tasks: list[SweTask], home: str) -> None:
    run_git("init", "-q", "--bare", str(git_dir), home=home)
    clean = write_tree(git_dir, repo_files(repo_dir(set_name, repo)), home)
    updates = []
    for task in tasks:
        try:
            sha = commit_tree(git_dir, base_tree(git_dir, clean, task.patch, home), home)
        except GitError as exc:
            raise TaskFileError(f"{BUILTIN_PREFIX}{set_name}: {task.instance_id}: the gold patch does not reverse-"
                                f"apply to repos/{repo}: {exc.stderr}") from None
        if sha != task.base_commit:
            raise TaskFileError(f"{BUILTIN_PREFIX}{set_name}: {task.instance_id}: base commit rebuilt as {sha}, the "
                                f"task file says {task.base_commit} (regenerate: python -m tools.tiny_build)")
        updates.append(f"create refs/heads/swe/{task.instance_id} {sha}\n")
    run_git("--git-dir", str(git_dir), "update-ref", "--stdin", input="".join(updates).encode(), home=home)
    run_git("--git-dir", str(git_dir), "prune", "--expire=now", home=home)  # the clean blobs were scaffolding


def materialize(set_name: str, repo: str, cache_dir: str | Path | None = None) -> Path:
    """A bare repository with every base commit of `repo`'s tasks on branch swe/<instance_id>, built once.

    A file lock serialises builders and temp dir + rename publishes, so concurrent callers (threads or
    processes) never see a half-built repository; one left by older data (other refs) is rebuilt."""
    src = repo_dir(set_name, repo)
    tasks = [t for t in set_tasks(set_name) if t.workdir == f"{BUILTIN_PREFIX}{repo}"]
    if not tasks:
        raise TaskFileError(f"{BUILTIN_PREFIX}{set_name}: no task uses repository {src.name!r}")
    expected = {f"refs/heads/swe/{t.instance_id}": t.base_commit for t in tasks}
    parent = (Path(cache_dir).expanduser() if cache_dir else cache_root()) / "swe" / set_name
    final = parent / f"{repo}.git"
    with tempfile.TemporaryDirectory(prefix="slimecli-git-home-") as home:
        if _refs(final, home) == expected:
            return final
        parent.mkdir(parents=True, exist_ok=True)
        with open(parent / f".{repo}.git.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _refs(final, home) == expected:
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{repo}.git.", dir=parent))
            stale = parent / f".{repo}.git.stale-{os.getpid()}"
            try:
                _build(tmp, set_name, repo, tasks, home)
                tmp.chmod(0o755)
                if final.exists():
                    os.replace(final, stale)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.rmtree(stale, ignore_errors=True)
    return final
