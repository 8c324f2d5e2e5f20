"""A fresh git work tree for one task: exactly the base commit, nothing that could lead the agent to the fix.

The agent may run any git command in the workspace, so it holds one commit and only that commit's objects:
no remotes, no other branches, no reflog, no FETCH_HEAD naming where it came from. Every git call here runs
hermetically (`git_env`): the caller's GIT_* variables and global/system config could otherwise change
object hashes (init.defaultObjectFormat), sign commits, rewrite line endings or redirect the repository.
The git directory of one commit is made once per process and copied for each workspace (dircache.py).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from slimecli.swe.dircache import DirCache
from slimecli.swe.git import GIT_FLAGS as GIT_FLAGS
from slimecli.swe.git import GitError as GitError
from slimecli.swe.git import git_env as git_env
from slimecli.swe.git import run_git as run_git
from slimecli.swe.rows import BUILTIN_PREFIX, SweTask, TaskFileError

AGENT_NAME = "slimecli agent"
AGENT_EMAIL = "agent@slimecli.invalid"
LOCAL_CONFIG = f"[user]\n\tname = {AGENT_NAME}\n\temail = {AGENT_EMAIL}\n[commit]\n\tgpgsign = false\n"
IGNORED = ("__pycache__/", "*.pyc", ".pytest_cache/")  # what running the tests leaves: not the agent's change
GIT_DIRS = DirCache(max_entries=8, prefix="slimecli-git-dirs-")  # per (source repository, commit)


class WorkspaceError(Exception):
    """The task's workspace cannot be made: no such repository, commit not found, not a git repository."""


def _resolve_commit(git_dir: Path, commit: str, home: str, where: str) -> str:
    """The full SHA of `commit` (a SHA, a prefix of one, or a ref) in the repository."""
    try:
        if commit.startswith("-"):  # never an option to git
            raise GitError((), 1, "")
        return run_git("--git-dir", str(git_dir), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}",
                       home=home)
    except GitError:
        raise WorkspaceError(f"commit {commit} not found in {where}") from None


def _local_git_dir(path: Path, home: str) -> Path:
    """The git directory of the repository at exactly `path` (never one of its parents)."""
    if not path.exists():
        raise WorkspaceError(f"workdir {path}: no such directory")
    if not path.is_dir():
        raise WorkspaceError(f"workdir {path}: not a directory")
    try:
        found = run_git("rev-parse", "--absolute-git-dir", home=home, cwd=path,
                        env={"GIT_CEILING_DIRECTORIES": str(path.resolve().parent)})
    except GitError:
        raise WorkspaceError(f"workdir {path}: not a git repository") from None
    return Path(found)


def _builtin_git_dir(repo: str) -> Path:
    from slimecli.swe.builtin import locate, materialize

    set_name = locate(repo)
    if set_name is None:
        raise WorkspaceError(f"{BUILTIN_PREFIX}{repo}: no built-in repository of that name")
    try:
        return materialize(set_name, repo)
    except (TaskFileError, OSError) as exc:
        raise WorkspaceError(f"{BUILTIN_PREFIX}{repo}: cannot build its repository: {exc}") from None


def _source(task: SweTask, home: str) -> tuple[Path, str]:
    """(the git directory holding the task's base commit, how to name it in messages)."""
    workdir = task.workdir
    if not workdir:
        raise WorkspaceError(f"{task.instance_id}: the task has no workdir (an image-only task runs in its image)")
    if workdir.startswith(BUILTIN_PREFIX):
        return _builtin_git_dir(workdir[len(BUILTIN_PREFIX):]), workdir
    path = Path(workdir).expanduser()
    return _local_git_dir(path, home), f"workdir {path}"


def _make_git_dir(template: Path, git_dir: Path, sha: str, home: str) -> None:
    """`template`/.git: the repository of exactly `sha`, nothing checked out (copied for each workspace)."""
    def git(*args: str) -> str:
        return run_git(*args, home=home, cwd=template)

    # No template (no sample hooks to copy) and the identity written at once: each git process costs start-up.
    git("init", "-q", "--template=", ".")
    dot_git = template / ".git"
    with (dot_git / "config").open("a") as config:
        config.write(LOCAL_CONFIG)
    # Only this commit's objects come over: depth 1, no tags, straight into the branch HEAD names.
    git("fetch", "-q", "--depth", "1", "--no-tags", "--update-head-ok", str(git_dir), f"{sha}:refs/heads/main")
    header = git("cat-file", "commit", sha).split("\n\n", 1)[0]
    if not any(line.startswith("parent ") for line in header.splitlines()):
        (dot_git / "shallow").unlink(missing_ok=True)  # a root commit: nothing was cut off
    (dot_git / "FETCH_HEAD").unlink(missing_ok=True)  # it names the source repository
    (dot_git / "info").mkdir(exist_ok=True)
    (dot_git / "info" / "exclude").write_text("".join(f"{pattern}\n" for pattern in IGNORED))


def _check_out(dest: Path, git_dir: Path, sha: str, home: str) -> None:
    key = (str(git_dir.resolve()), sha)
    with GIT_DIRS.use(key, lambda template: _make_git_dir(template, git_dir, sha, home)) as template:
        shutil.copytree(template / ".git", dest / ".git", symlinks=True)
    run_git("reset", "-q", "--hard", "main", home=home, cwd=dest)
    (dest / ".git" / "ORIG_HEAD").unlink(missing_ok=True)
    shutil.rmtree(dest / ".git" / "logs", ignore_errors=True)


def prepare(task: SweTask, dest: Path) -> None:
    """Make the empty directory `dest` a clean work tree at exactly task.base_commit, as the agent should see it:
    one commit on branch main, a local user.name/user.email, no remote. WorkspaceError says why it cannot."""
    dest = Path(dest)
    if not dest.is_dir():
        raise WorkspaceError(f"workspace {dest}: not an existing directory")
    if any(dest.iterdir()):
        raise WorkspaceError(f"workspace {dest}: not empty")
    with tempfile.TemporaryDirectory(prefix="slimecli-git-home-") as home:
        git_dir, where = _source(task, home)
        sha = _resolve_commit(git_dir, task.base_commit, home, where)
        try:
            _check_out(dest, git_dir, sha, home)
        except (GitError, OSError) as exc:
            for child in dest.iterdir():  # leave dest as it was given: empty
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            raise WorkspaceError(f"{task.instance_id}: cannot check out {sha} from {where}: {exc}") from None


def read_at_commit(task: SweTask, commit: str, wanted: Callable[[str], bool],
                   dirs: tuple[str, ...] = ()) -> tuple[str, dict[str, bytes]]:
    """(the full SHA of `commit`, {path: content}) of the files at the top level of the task's repository (and
    directly in `dirs`) whose path `wanted` accepts, read from git without checking anything out."""
    with tempfile.TemporaryDirectory(prefix="slimecli-git-home-") as home:
        git_dir, where = _source(task, home)
        sha = _resolve_commit(git_dir, commit, home, where)
        try:
            names = run_git("--git-dir", str(git_dir), "ls-tree", "--name-only", "-z", sha, home=home, raw=True)
            for d in dirs:
                names += run_git("--git-dir", str(git_dir), "ls-tree", "--name-only", "-z", sha, f"{d}/",
                                 home=home, raw=True)
            found = {}
            for path in (p for p in names.split("\0") if p and wanted(p)):
                blob = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "blob", f"{sha}:{path}"],
                                      capture_output=True, env=git_env(home))
                if blob.returncode == 0:  # a directory or submodule of that name is not a file to read
                    found[path] = blob.stdout
        except GitError as exc:
            raise WorkspaceError(f"{task.instance_id}: cannot read {where} at {sha}: {exc}") from None
    return sha, found
