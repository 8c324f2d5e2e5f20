"""Grading an agent's diff: a fresh sandbox at the base commit, the diff, the hidden tests, a reward.

Nothing of the agent's sandbox is trusted but the diff text. Every git command and the test run happen
through `sandbox.exec` in a new sandbox over a freshly prepared workspace; the grader's own files (the
diff, the test patch, the JUnit report) live under the workspace's .git, where no diff reaches and pytest
never looks. Edits to tests cannot help: every test-like path the diff touches is put back to the base
before the test patch is applied. What cannot be graded (a broken environment, the budget spent) raises
`Unevaluatable`, so the sample is aborted rather than scored 0.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from slimecli.swe import junit
from slimecli.swe.git import GIT_FLAGS
from slimecli.swe.rows import SweTask
from slimecli.swe.workspace import WorkspaceError, prepare

if TYPE_CHECKING:
    from slimecli.sandbox.base import Sandbox

HARNESS_FILES = ("PROBLEM_STATEMENT.md",)  # what the harness puts in the agent's workspace: never its change
GRADER_DIR = ".git/slimecli-grade"  # relative to the workspace
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
TEST_DIRS = frozenset({"tests", "test"})
# .gitattributes: its eol/filter settings would change how the tests are checked out and patched.
TEST_FILES = frozenset({"conftest.py", "pytest.ini", "tox.ini", ".gitattributes"})
# A new top-level module of one of these names would shadow what the test runner imports (cwd is on sys.path).
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "exceptiongroup", "tomli"})
TAIL = 2000  # characters of a command's output kept in a reason
# Every script prints this to stderr first: without it, the sandbox never ran the script (not the diff's fault).
STARTED = "@slimecli-started"
SEP = "\0--slimecli--\0"  # between the NUL-separated lists of one output
_SEP_SH = "\\000--slimecli--\\000"  # how printf writes it
# The workspace is the grader's own, fresh: safe.directory=* lets a sandbox user other than its owner use it.
_GIT_VARS = " ".join(f"{k}={shlex.quote(v)}" for k, v in GIT_ENV.items())  # for git only, not the tests
_SH_GIT = f"g() {{ {_GIT_VARS} git {shlex.join(GIT_FLAGS)} -c safe.directory='*' --literal-pathspecs \"$@\"; }}\n"

# Two scripts per grading, as each sandbox command has a start-up cost.
# 1. $1: the diff file, or "" for none. Each rung starts from a clean tree; stderr names the rung that applied
# it. The refresh: a sandbox that hands the files to its own uid changes their ctime, which --3way (--index)
# takes for edits. Then stdout lists everything the change touched (staged, so untracked files count),
# files it left in ignored places, and the base's top-level names.
APPLY_SCRIPT = _SH_GIT + f"""clean() {{ g reset -q --hard; g clean -fdq; }}
g update-index -q --refresh >/dev/null
if [ -z "$1" ]; then m=none
elif g apply --3way --whitespace=nowarn "$1" >&2; then m=git_apply_3way
else clean; if g apply --whitespace=nowarn "$1" >&2; then m=git_apply
else clean; if patch -p1 --forward --batch --dry-run -s <"$1" >/dev/null 2>&1 &&
   patch -p1 --forward --batch -s --no-backup-if-mismatch -r - <"$1" >&2; then m=patch
else clean; exit 1; fi; fi; fi
echo "@method=$m" >&2
g add -A && g diff --cached --name-only -z --no-renames HEAD && printf '{_SEP_SH}' &&
g ls-files -z -o -i --exclude-standard && printf '{_SEP_SH}' && g ls-tree -z --name-only HEAD
"""
# 2. $1: the test patch; then the protected paths, "--", the test files that must exist. Paths the base
# lacks go first (a symlink in place of a test directory must be gone before the directory is checked out
# again). Exit 3/4/5 before "@restored": restoring, the test patch, missing test files. Then the tests.
RESTORE_SCRIPT = _SH_GIT + """tp=$1; shift
for p; do [ "$p" = -- ] && break; g cat-file -e "HEAD:$p" 2>/dev/null ||
  { g rm -rfq --cached --ignore-unmatch -- "$p" >/dev/null && rm -rf -- "$p"; } || exit 3; done
for p; do [ "$p" = -- ] && break; ! g cat-file -e "HEAD:$p" 2>/dev/null || g checkout -q HEAD -- "$p" || exit 3; done
[ ! -s "$tp" ] || g apply --whitespace=nowarn "$tp" || exit 4
seen=; miss=; for f; do if [ -n "$seen" ]; then [ -f "$f" ] || { echo "@missing=$f" >&2; miss=1; }
  elif [ "$f" = -- ]; then seen=1; fi; done
[ -z "$miss" ] || exit 5
echo "@restored" >&2
"""
SNAPSHOT_SCRIPT = _SH_GIT + f"""g add -A && {{ g diff --cached --quiet || g commit -q --no-verify -m "slimecli: setup"; }} &&
g ls-files -z -o -i --exclude-standard && printf '{_SEP_SH}'
"""


class Unevaluatable(Exception):
    """The diff cannot be graded here (not the agent's fault): the sample becomes aborted, never a 0.

    `reason` is one of timeout, disk, workspace, sandbox, setup, apply_env, test_patch, test_files, runner,
    no_report, diff; the caller records `unevaluatable:<reason>`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class GradeLimiter(asyncio.Semaphore):
    """How many gradings run at once (each is a sandbox running a test suite)."""

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"grading concurrency must be >= 1, got {concurrency}")
        super().__init__(concurrency)


@dataclass
class GradeReport:
    resolved: bool
    f2p: float  # fraction of FAIL_TO_PASS tests that passed
    p2p: float  # fraction of PASS_TO_PASS tests that passed (1.0 when there are none)
    applied: bool
    touched_tests: bool  # the diff changed a test-like path (undone before the tests ran)
    apply_method: str | None  # git_apply_3way | git_apply | patch; None when nothing applied
    tests: dict[str, str] = field(default_factory=dict)  # node id -> passed|failed|error|skipped|missing
    elapsed_s: float = 0.0
    error: str | None = None  # why the diff scored what it did when that was not the tests' verdict
    partial: bool = False

    def reward(self, partial: bool | None = None) -> float:
        """Binary: resolved. Partial: the F2P fraction, but only when no P2P test broke."""
        if not (self.partial if partial is None else partial):
            return float(self.resolved)
        return self.f2p if self.applied and self.p2p == 1.0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {"resolved": int(self.resolved), "f2p": self.f2p, "p2p": self.p2p, "applied": int(self.applied),
                "touched_tests": int(self.touched_tests), "reward": self.reward()}


def local_sandbox(workdir: Path) -> Sandbox:
    """The default: a local sandbox whose PATH starts with this interpreter's directory (its python has pytest)."""
    from slimecli.sandbox.local import LocalSandbox

    return LocalSandbox(workdir, path_dirs=(str(Path(sys.executable).parent),))


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def is_protected(path: str, base_top: frozenset[str] = frozenset()) -> bool:
    """A path edits to which could fake a pass: tests, pytest configuration, or a new top-level module that
    shadows what the runner imports (`base_top`: the base's top-level names, which stay editable)."""
    parts = PurePosixPath(path).parts
    if not parts:
        return False
    name = parts[-1]
    if TEST_DIRS.intersection(parts[:-1]) or name in TEST_DIRS or name in TEST_FILES:
        return True
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return True
    top = parts[0]
    module = top.split(".", 1)[0]
    return top not in base_top and (module in RUNNER_MODULES or module in sys.stdlib_module_names)


def patch_paths(diff: str) -> list[str]:
    """The paths a git-style diff names (old and new sides), for paths git's own view could miss."""
    paths: list[str] = []
    for line in diff.splitlines():
        m = re.match(r"^(?:---|\+\+\+) (?:[ab]/)?(.+?)(?:\t.*)?$", line)
        if m is None:
            m = re.match(r"^(?:rename|copy) (?:from|to) (.+)$", line)
        if m and m.group(1) != "/dev/null":
            path = m.group(1)
            if path.startswith('"'):
                path = path.strip('"').encode("latin-1", "backslashreplace").decode("unicode_escape")
                path = path.encode("latin-1", "replace").decode("utf-8", "replace")
            paths.append(path)
    return list(dict.fromkeys(paths))


def test_files(task: SweTask) -> list[str]:
    """The files of the F2P and P2P node ids: whole files run, so one bad id cannot error the whole run."""
    return list(dict.fromkeys(node.split("::", 1)[0] for node in task.tests))


class _Run:
    """One grading's sandbox calls against one deadline."""

    def __init__(self, sandbox: Sandbox, deadline: float) -> None:
        self.sandbox = sandbox
        self.deadline = deadline

    def left(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Unevaluatable("timeout", f"the grading budget ran out before {what}")
        return left

    async def sh(self, script: str, *args: str, what: str, limit: float | None = None,
                 missing: str = "sandbox", env: Mapping[str, str] | None = None) -> Any:
        """Run a shell script; a timeout or a missing command (exit 126/127: `missing` is the reason) raises.

        `env` adds to the sandbox's own scrubbed environment (the scripts' git is hermetic by itself)."""
        timeout = self.left(what) if limit is None else min(limit, self.left(what))
        result = await self.sandbox.exec(["/bin/sh", "-c", f"echo {STARTED} >&2\n{script}", "sh", *args],
                                         timeout_s=timeout, env=dict(env or {}))
        if getattr(result, "killed_for", None) == "disk":
            raise Unevaluatable("disk", f"{what} was killed: the sandbox's disk quota ran out")
        if result.timed_out or result.returncode is None:
            raise Unevaluatable("timeout", f"{what} did not finish within {timeout:.1f}s")
        if not result.stderr.startswith(STARTED):
            raise Unevaluatable("sandbox", f"{what}: the sandbox did not run it: {_tail(result.stderr)}")
        result.stderr = result.stderr[len(STARTED) + 1:]
        if result.returncode in (126, 127):
            raise Unevaluatable(missing, f"{what}: a command is missing: {_tail(result.stdout + result.stderr)}")
        return result


def _split(out: str) -> list[list[str]]:
    return [[p for p in part.split("\0") if p] for part in out.split(SEP)]


async def _setup(run: _Run, task: SweTask) -> set[str]:
    """The task's setup commands, then a commit of what they changed (so resets between apply attempts keep
    it); returns the ignored files they left, which are not the diff's."""
    for cmd in task.setup_commands:
        result = await run.sh(cmd, what=f"setup command {cmd!r}", missing="setup")
        if result.returncode != 0:
            raise Unevaluatable("setup", f"{cmd!r} exited {result.returncode}: {_tail(result.stdout + result.stderr)}")
    result = await run.sh(SNAPSHOT_SCRIPT, what="the setup snapshot")
    if result.returncode != 0:
        raise Unevaluatable("setup", f"cannot snapshot the tree after setup: {_tail(result.stderr)}")
    return set(_split(result.stdout)[0])


async def _apply(run: _Run, diff_file: str) -> tuple[str | None, str, list[list[str]]]:
    """(the rung that applied the diff: None when none did, "none" for no diff; why not; the listing)."""
    result = await run.sh(APPLY_SCRIPT, diff_file, what="applying the diff")
    method = re.search(r"^@method=(\w+)$", result.stderr, re.M)
    if method is None:
        return None, _tail(result.stderr), []
    parts = _split(result.stdout)
    if result.returncode != 0 or len(parts) != 3:
        raise Unevaluatable("apply_env", f"cannot list the changed paths: {_tail(result.stderr)}")
    return method.group(1), "", parts


def _protected(task: SweTask, diff: str, listing: list[list[str]], ignored_before: set[str]) -> list[str]:
    """The changed paths to put back to base: the test patch's, and every test-like one."""
    changed, ignored, base_top = listing[0], set(listing[1]) - ignored_before, frozenset(listing[2])
    test_patch_paths = set(patch_paths(task.test_patch))
    candidates = dict.fromkeys([*changed, *sorted(ignored), *patch_paths(diff)])
    return [p for p in candidates if p in test_patch_paths or is_protected(p, base_top)]


def _test_command(task: SweTask, report: str, files: list[str]) -> tuple[str, bool]:
    """(a shell command, whether it writes the JUnit report)."""
    if task.test_cmd is None:
        argv = ["python", "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q",
                "--continue-on-collection-errors", f"--junitxml={report}", "--", *files]
        return shlex.join(argv), True
    values = {"junit": shlex.quote(report), "tests": shlex.join(files), "ids": shlex.join(task.tests)}
    cmd = re.sub(r"\{(junit|tests|ids)\}", lambda m: values[m.group(1)], task.test_cmd)
    return cmd, "{junit}" in task.test_cmd


async def _restore_and_test(run: _Run, task: SweTask, protected: list[str], tp_file: str, files: list[str],
                            env: Mapping[str, str] | None) -> tuple[dict[str, str], str | None]:
    """Put protected paths back, apply the test patch, run the tests: node id -> status, and why there is no
    verdict from the tests when their run crashed (the agent's code: still a legitimate fail)."""
    report = f"{GRADER_DIR}/junit-{secrets.token_hex(8)}.xml"
    cmd, writes_report = _test_command(task, report, files)
    must_exist = files if task.test_cmd is None else []  # a custom command's ids need not name files
    guard = (f'r={shlex.quote(report)}; if [ -f "$r" ] && [ "$(wc -c <"$r")" -gt {junit.MAX_BYTES} ]; then '
             f'rm -f "$r"; echo "@report_too_large" >&2; fi')
    script = f"{RESTORE_SCRIPT}( {cmd}\n); rc=$?; {guard}; exit $rc"
    result = await run.sh(script, tp_file, *protected, "--", *must_exist, what="the tests", limit=task.timeout_s,
                          missing="runner", env=env or {})
    if "@restored" not in result.stderr:
        detail = _tail(result.stderr)
        if result.returncode == 4:
            raise Unevaluatable("test_patch", f"the test patch does not apply at base: {detail}")
        if result.returncode == 5:
            missing = re.findall(r"^@missing=(.*)$", result.stderr, re.M)
            raise Unevaluatable("test_files", f"test files not there after the test patch: {missing}")
        raise Unevaluatable("apply_env", f"cannot restore the tests (exit {result.returncode}): {detail}")
    if not writes_report:  # a custom command without {junit}: its exit status is the verdict for every test
        status = junit.PASSED if result.returncode == 0 else junit.FAILED
        return dict.fromkeys(task.tests, status), None if result.returncode == 0 else f"exit {result.returncode}"
    parsed = junit.parse(run.sandbox.read_file(run.sandbox.workdir / report))
    if parsed.error is None:
        return parsed.statuses(task.tests), None
    output = _tail(result.stdout + result.stderr.split("@restored", 1)[-1])
    if task.test_cmd is not None:
        raise Unevaluatable("no_report", f"{parsed.error} (exit {result.returncode}): {output}")
    probe = await run.sh("python -c 'import pytest'", what="probing the test runner", missing="runner",
                         env=dict(env or {}))
    if probe.returncode != 0:
        raise Unevaluatable("runner", f"python cannot import pytest here: {_tail(probe.stderr)}")
    # The runner works, so the code under test crashed it (or wrote over its report): a legitimate fail.
    return parsed.statuses(task.tests), f"{parsed.error} (exit {result.returncode}): {output}"


def _fraction(tests: dict[str, str], ids: Sequence[str]) -> float:
    return sum(tests[i] == junit.PASSED for i in ids) / len(ids) if ids else 1.0


def _report(task: SweTask, *, applied: bool, method: str | None = None, touched: bool = False,
            tests: dict[str, str] | None = None, error: str | None = None, start: float, partial: bool) -> GradeReport:
    tests = tests if tests is not None else dict.fromkeys(task.tests, junit.MISSING)
    f2p, p2p = _fraction(tests, task.fail_to_pass), _fraction(tests, task.pass_to_pass)
    return GradeReport(resolved=applied and f2p == 1.0 and p2p == 1.0, f2p=f2p, p2p=p2p, applied=applied,
                       touched_tests=touched, apply_method=method, tests=tests, elapsed_s=time.monotonic() - start,
                       error=error, partial=partial)


async def _grade_in(sandbox: Sandbox, task: SweTask, diff: str, deadline: float, start: float, partial: bool,
                    test_env: Mapping[str, str] | None) -> GradeReport:
    run = _Run(sandbox, deadline)
    ignored_before = await _setup(run, task) if task.setup_commands else set()
    diff_file, tp_file = f"{GRADER_DIR}/agent.diff", f"{GRADER_DIR}/test.diff"
    sandbox.write_file(sandbox.workdir / tp_file, task.test_patch.rstrip("\n") + "\n" if task.test_patch.strip() else "")
    if diff.strip():
        sandbox.write_file(sandbox.workdir / diff_file, diff.rstrip("\n") + "\n")
    method, why, listing = await _apply(run, diff_file if diff.strip() else "")
    if method is None:  # the agent's own diff of its own workspace: failing to apply is its doing
        return _report(task, applied=False, error=f"the diff does not apply: {why}", start=start, partial=partial)
    applied = method != "none"
    protected = _protected(task, diff if applied else "", listing, ignored_before)
    tests, crash = await _restore_and_test(run, task, protected, tp_file, test_files(task), test_env)
    return _report(task, applied=applied, method=method if applied else None, touched=bool(protected), tests=tests,
                   error=crash if applied else "empty diff", start=start, partial=partial)


async def evaluate(task: SweTask, diff: str, *, sandbox_factory: Callable[[Path], Sandbox] = local_sandbox,
                   budget_s: float, partial: bool = False, test_env: Mapping[str, str] | None = None) -> GradeReport:
    """Grade `diff` in a fresh sandbox, running the tests even for an empty diff (the base's verdict).

    `test_env`: extra environment of the test run (the sandbox's own is scrubbed)."""
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="slimecli-grade-"))
    tmp.chmod(0o711)  # a sandbox running as its own uid must reach the workspace (not list its siblings)
    sandbox: Sandbox | None = None
    try:
        workdir = tmp / "workspace"
        workdir.mkdir()
        try:
            await asyncio.to_thread(prepare, task, workdir)
        except WorkspaceError as exc:
            raise Unevaluatable("workspace", str(exc)) from None
        try:
            sandbox = sandbox_factory(workdir)
        except (OSError, RuntimeError, ValueError) as exc:
            raise Unevaluatable("sandbox", f"cannot start the grading sandbox: {exc}") from None
        return await _grade_in(sandbox, task, diff, start + budget_s, start, partial, test_env)
    finally:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def grade(task: SweTask, diff: str, *, sandbox_factory: Callable[[Path], Sandbox] = local_sandbox,
                budget_s: float, partial: bool = False, limiter: asyncio.Semaphore | None = None,
                test_env: Mapping[str, str] | None = None) -> GradeReport:
    """The agent's diff against the task's hidden tests; raises Unevaluatable when it cannot be graded.

    An empty diff scores 0 without a sandbox. `budget_s` covers setup, apply and tests (not the wait for
    `limiter`)."""
    if not diff.strip():
        return _report(task, applied=False, error="empty diff", start=time.monotonic(), partial=partial)
    kwargs: dict[str, Any] = {"sandbox_factory": sandbox_factory, "budget_s": budget_s, "partial": partial,
                              "test_env": test_env}
    if limiter is None:
        return await evaluate(task, diff, **kwargs)
    async with limiter:
        return await evaluate(task, diff, **kwargs)


async def capture_diff(sandbox: Sandbox, exclude: Sequence[str] = HARNESS_FILES, timeout_s: float = 60.0) -> str:
    """The agent's change in its own sandbox (untracked files included), computed inside that sandbox."""
    try:
        return await sandbox.diff(exclude=tuple(exclude), timeout_s=timeout_s)
    except TimeoutError:
        raise Unevaluatable("timeout", f"capturing the diff took over {timeout_s}s") from None
    except (OSError, RuntimeError) as exc:
        raise Unevaluatable("diff", f"cannot capture the agent's diff: {exc}") from None
