"""Where synthesis starts and what it leaves: SRC as a clean tree, and the git repository of the tasks' bases.

SRC is a git checkout (its HEAD, never uncommitted edits), a plain directory, or an sdist archive (.tar.gz,
.tgz, .tar.bz2, .zip; one top-level directory is stepped into). Build leftovers (egg-info, caches, venvs) are
not part of the tree.

The task repository is a bare repository. Every task's base is a root commit of its own (the clean tree with
the bug in and the hidden test files out), so the agent's one-commit checkout cannot lead back to the clean
code. Commits are made with git's plumbing under a fixed author and date, so the same tasks give the same SHAs
and the task file is the same byte for byte.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from slimecli.swe.workspace import GitError, git_env, run_git

ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
SKIP = ("__pycache__", ".git", ".hg", ".tox", ".nox", ".venv", "venv", ".pytest_cache", ".mypy_cache",
        ".ruff_cache", "build", "dist", ".eggs")
MARKER = "slimecli-synth"  # in the task repository's git directory: this command made it and may replace it
IDENTITY = {"GIT_AUTHOR_NAME": "slimecli synth", "GIT_AUTHOR_EMAIL": "synth@slimecli.invalid",
            "GIT_COMMITTER_NAME": "slimecli synth", "GIT_COMMITTER_EMAIL": "synth@slimecli.invalid",
            "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}


class SourceError(Exception):
    """SRC cannot be used (missing, unreadable archive, no Python files)."""


@dataclass(frozen=True)
class Source:
    tree: Path  # the clean tree (a temporary directory the caller removes)
    name: str  # the project's name: the tasks' `repo`
    version: str


def _ignored(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in SKIP or n.endswith((".egg-info", ".pyc"))}


def _pkg_info(tree: Path, fallback: str) -> tuple[str, str]:
    name, version = fallback, ""
    m = re.match(r"^(.+?)-(\d[\w.+!-]*)$", fallback)
    if m:
        name, version = m.group(1), m.group(2)
    info = tree / "PKG-INFO"
    if info.is_file():
        text = info.read_text(errors="replace")
        found = re.search(r"^Name:\s*(.+)$", text, re.M), re.search(r"^Version:\s*(.+)$", text, re.M)
        name = found[0].group(1).strip() if found[0] else name
        version = found[1].group(1).strip() if found[1] else version
    return name, version


def _extract(archive: Path, dest: Path) -> Path:
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise SourceError(f"{archive}: unsafe path {member!r} in the archive")
                z.extractall(dest)
        else:
            with tarfile.open(archive) as t:
                t.extractall(dest, filter="data")
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise SourceError(f"{archive}: cannot extract ({exc})") from None
    entries = [p for p in dest.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def _git_head(src: Path, dest: Path) -> str:
    """The checkout's HEAD as files in `dest`; its short SHA."""
    with tempfile.TemporaryDirectory(prefix="slimecli-git-home-") as home:
        try:
            sha = run_git("rev-parse", "--short=12", "HEAD", home=home, cwd=src)
        except GitError as exc:
            raise SourceError(f"{src}: a git checkout without a commit to read ({exc})") from None
        proc = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=src, capture_output=True,
                              env=git_env(home))
    if proc.returncode != 0:
        raise SourceError(f"{src}: git archive HEAD failed: {proc.stderr.decode(errors='replace').strip()}")
    tar = dest.parent / "head.tar"
    tar.write_bytes(proc.stdout)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    tar.unlink()
    return sha


def materialize(src: Path, work: Path) -> Source:
    """SRC as a clean tree under the empty directory `work`."""
    src = src.expanduser()
    if not src.exists():
        raise SourceError(f"{src}: no such file or directory")
    tree = work / "tree"
    if src.is_file():
        if not src.name.endswith(ARCHIVES):
            raise SourceError(f"{src}: not a directory or an sdist archive ({', '.join(ARCHIVES)})")
        unpacked = work / "unpacked"
        unpacked.mkdir()
        top = _extract(src, unpacked)
        shutil.copytree(top, tree, ignore=_ignored, symlinks=True)
        name, version = _pkg_info(tree, top.name if top != unpacked else src.name.split(".tar")[0])
    elif (src / ".git").exists():
        tree.mkdir()
        sha = _git_head(src, tree)
        shutil.rmtree(tree / ".git", ignore_errors=True)
        name, version = _pkg_info(tree, src.resolve().name)
        version = version or sha
    else:
        shutil.copytree(src, tree, ignore=_ignored, symlinks=True)
        name, version = _pkg_info(tree, src.resolve().name)
    (tree / "PKG-INFO").unlink(missing_ok=True)  # the sdist's metadata: not the project's source
    if not any(tree.rglob("*.py")):
        raise SourceError(f"{src}: no Python files")
    return Source(tree, name, version)


class TaskRepo:
    """The bare repository the tasks' `workdir` names."""

    def __init__(self, path: Path, home: str) -> None:
        self.path, self.home = path, home

    def git(self, *args: str, input: bytes | None = None, index: Path | None = None, tree: Path | None = None) -> str:
        env = dict(IDENTITY)
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        if tree is not None:
            env["GIT_WORK_TREE"] = str(tree)
        return run_git("--git-dir", str(self.path), *args, home=self.home, input=input, env=env)

    @classmethod
    def create(cls, path: Path, home: str) -> TaskRepo:
        """A new bare repository at `path`, replacing one this command made before (never anything else)."""
        if path.exists() and any(path.iterdir()):
            if not (path / MARKER).is_file():
                raise SourceError(f"{path}: exists and is not a task repository made by `slimecli tasks synth`")
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        repo = cls(path, home)
        repo.git("init", "-q", "--bare")
        (path / MARKER).write_text("made by `slimecli tasks synth`; it replaces this repository when run again\n")
        return repo

    def import_tree(self, tree: Path) -> str:
        """The tree object of a directory's files."""
        index = self.path / "synth-index"
        try:
            self.git("add", "-A", "-f", ".", index=index, tree=tree)
            return self.git("write-tree", index=index)
        finally:
            index.unlink(missing_ok=True)

    def commit(self, base_tree: str, changed: dict[str, bytes], removed: list[str], message: str, ref: str) -> str:
        """A root commit of `base_tree` with `changed` files written and `removed` ones gone; kept under `ref`."""
        index = self.path / f"synth-index-{abs(hash(ref))}"
        try:
            self.git("read-tree", base_tree, index=index)
            entries = []
            for path, content in sorted(changed.items()):
                mode = self.git("ls-tree", base_tree, "--", path).split(" ", 1)[0] or "100644"
                entries.append(f"{mode} {self.git('hash-object', '-w', '--stdin', input=content)}\t{path}\n")
            entries += [f"0 {'0' * 40}\t{path}\n" for path in sorted(removed)]  # mode 0: remove the path
            if entries:
                self.git("update-index", "--index-info", input="".join(entries).encode(), index=index)
            tree = self.git("write-tree", index=index)
        finally:
            index.unlink(missing_ok=True)
        sha = self.git("commit-tree", tree, "-m", message)
        self.git("update-ref", ref, sha)
        return sha

    def read(self, tree: str, path: str) -> bytes:
        proc = subprocess.run(["git", "--git-dir", str(self.path), "cat-file", "blob", f"{tree}:{path}"],
                              capture_output=True, env=git_env(self.home))
        if proc.returncode != 0:
            raise SourceError(f"{path}: not in the clean tree")
        return proc.stdout
