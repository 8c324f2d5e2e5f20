"""Grading SWE diffs for real: git, pytest subprocesses and the sandboxes there are, on a small fixture
repository (and every built-in task through `check_task`): JUnit parsing, the apply ladder, protected
tests, partial reward, and what is unevaluatable rather than a 0."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slimecli.swe import junit
from slimecli.swe.check import check_task, fake_test_file, file_diff
from slimecli.swe.grade import GradeLimiter, GradeReport, Unevaluatable, capture_diff, evaluate, grade, is_protected
from slimecli.swe.task import SweTask, load
from slimecli.swe.workspace import prepare

FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # this environment's plugins cost most of a test run's time
BIN = str(Path(sys.executable).parent)


# ---------------------------------------------------------------- sandboxes


def _bwrap_unavailable() -> str | None:
    from slimecli.sandbox.bwrap import available

    return available()


class _ContractSandbox:
    """Today's agent sandbox plus `diff`, as the sandbox contract has it: stands in while the checkout has no
    sandbox package."""

    kind = "local"

    def __init__(self, workdir: Path, *, path_dirs: tuple[str, ...] = (), ro_paths: tuple[str, ...] = ()) -> None:
        from slimecli.agent.sandbox import LocalSandbox

        self._box = LocalSandbox(workdir, path_dirs=list(path_dirs))
        self.workdir, self.home = self._box.workdir, self._box.home
        self.exec, self.read_file, self.write_file, self.close = (self._box.exec, self._box.read_file,
                                                                  self._box.write_file, self._box.close)

    async def diff(self, exclude: tuple[str, ...] = (), timeout_s: float = 60) -> str:
        index = ".git/slimecli-diff-index"
        script = (f"cp .git/index {index}; export GIT_INDEX_FILE={index}; git add -A && "
                  f"git diff --cached --binary HEAD -- . \"$@\"; rc=$?; rm -f {index}; exit $rc")
        result = await self.exec(["/bin/sh", "-c", script, "sh", *(f":(exclude,literal){p}" for p in exclude)],
                                 timeout_s)
        if result.returncode != 0:
            raise RuntimeError(result.stderr)
        return result.stdout


try:
    from slimecli.config.groups.sandbox import SandboxConfig
    from slimecli.sandbox.factory import make_sandbox
except ImportError:  # a checkout without the sandbox package: the contract double
    make_sandbox = None
KINDS = ["local", "bwrap"] if make_sandbox is not None else ["local"]


def sandbox_of(kind: str, path_dirs: tuple[str, ...] = (BIN,)):
    """A factory of `kind` sandboxes whose python is this interpreter (its prefixes readable inside)."""
    ro = tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))
    if make_sandbox is None:
        return lambda workdir: _ContractSandbox(workdir, path_dirs=path_dirs, ro_paths=ro)
    return lambda workdir: make_sandbox(SandboxConfig(name=kind), workdir, path_dirs=path_dirs, ro_paths=ro)


LOCAL = sandbox_of("local")
SANDBOXES = [pytest.param(sandbox_of(kind), id=kind, marks=[pytest.mark.skipif(
    kind == "bwrap" and _bwrap_unavailable() is not None, reason="bwrap cannot run here")]) for kind in KINDS]


# ---------------------------------------------------------------- the fixture repository

MATHX = '''"""Tiny arithmetic."""

VERSION = "1.0"


def add(a, b):
    return a - b


def neg(a):
    return a * -1


def mul(a, b):
    return a * b
'''
TEST_MATHX = '''import pytest

from mathx import mul, neg


def test_mul():
    assert mul(2, 3) == 6


def test_neg():
    assert neg(2) == -2


class TestMul:
    @pytest.mark.parametrize("a,b", [(2, 3), (0, 5)])
    def test_param(self, a, b):
        assert mul(a, b) == a * b
'''
TEST_ADD = '''from mathx import add


def test_add():
    assert add(2, 3) == 5


def test_add_zero():
    assert add(0, 3) == 3
'''
GOLD = MATHX.replace("return a - b", "return a + b")
F2P = ("tests/test_add.py::test_add", "tests/test_add.py::test_add_zero")
P2P = ("tests/test_mathx.py::test_mul", "tests/test_mathx.py::test_neg", "tests/test_mathx.py::TestMul::test_param[2-3]",
       "tests/test_mathx.py::TestMul::test_param[0-5]")


def git(*args: str, cwd: Path, input: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t"})
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"git {args}: {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("repo") / "mathx"
    (root / "tests").mkdir(parents=True)
    (root / "mathx.py").write_text(MATHX)
    (root / "tests" / "test_mathx.py").write_text(TEST_MATHX)
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\naddopts = "-x --no-such"\n')
    git("init", "-q", "-b", "main", ".", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "base", cwd=root)
    return root, git("rev-parse", "HEAD", cwd=root).strip()


def diff_of(task: SweTask, tmp: Path, files: dict[str, str | None]) -> str:
    """The diff a workspace at base shows after writing `files` (None deletes), untracked files included."""
    work = tmp / f"edit-{len(list(tmp.iterdir()))}"
    work.mkdir()
    prepare(task, work)
    for path, text in files.items():
        if text is None:
            (work / path).unlink()
        else:
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_text(text)
    git("add", "-A", cwd=work)
    return git("diff", "--cached", "HEAD", cwd=work)


@pytest.fixture(scope="module")
def task(repo: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> SweTask:
    root, sha = repo
    bare = SweTask(instance_id="mathx-1", repo="t/mathx", base_commit=sha, problem_statement="add() subtracts",
                   patch="", test_patch="", fail_to_pass=F2P, pass_to_pass=P2P, workdir=str(root))
    tmp = tmp_path_factory.mktemp("diffs")
    return SweTask(**{**bare.__dict__, "patch": diff_of(bare, tmp, {"mathx.py": GOLD}),
                      "test_patch": diff_of(bare, tmp, {"tests/test_add.py": TEST_ADD})})


def run(coro):
    return asyncio.run(coro)


def grade_fast(task: SweTask, diff: str, factory=LOCAL, budget_s: float = 60, **kw) -> GradeReport:
    return run(grade(task, diff, sandbox_factory=factory, budget_s=budget_s, test_env=FAST, **kw))


# ---------------------------------------------------------------- JUnit


@pytest.mark.parametrize(("node_id", "key"), [
    ("tests/test_x.py::test_y", ("tests.test_x", "test_y")),
    ("tests/test_x.py::TestC::test_y[param]", ("tests.test_x.TestC", "test_y[param]")),
    ("a/b.py::C::D::t[x::y/z.py]", ("a.b.C.D", "t[x::y/z.py]")),
    ("test_top.py::test_t", ("test_top", "test_t")),
])
def test_junit_keys_follow_pytest(node_id, key):
    assert junit.junit_key(node_id) == key


def test_junit_statuses_with_classes_params_and_missing_ids():
    xml = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
      <testcase classname="tests.test_x" name="test_ok"/>
      <testcase classname="tests.test_x.TestC" name="test_p[a::b]"/>
      <testcase classname="tests.test_x.TestC" name="test_p[2]"><failure message="boom"/></testcase>
      <testcase classname="tests.test_x" name="test_err"><error message="setup"/></testcase>
      <testcase classname="tests.test_x" name="test_skip"><skipped type="pytest.skip"/></testcase>
      <testcase classname="tests.test_x" name="test_xfail"><skipped type="pytest.xfail"/></testcase>
      <testcase classname="tests.test_x" name="test_twice"/>
      <testcase classname="tests.test_x" name="test_twice"><error message="teardown"/></testcase>
    </testsuite></testsuites>"""
    report = junit.parse(xml)
    assert report.error is None
    ids = ["tests/test_x.py::test_ok", "tests/test_x.py::TestC::test_p[a::b]", "tests/test_x.py::TestC::test_p[2]",
           "tests/test_x.py::test_err", "tests/test_x.py::test_skip", "tests/test_x.py::test_xfail",
           "tests/test_x.py::test_twice", "tests/test_x.py::test_absent", "tests/test_x.py::TestC::test_ok"]
    assert list(report.statuses(ids).values()) == ["passed", "passed", "failed", "error", "skipped", "skipped",
                                                  "error", "missing", "missing"]


@pytest.mark.parametrize("text", [None, "", "not xml", "<testsuites><testcase", "<html/>",
                                  '<!DOCTYPE x [<!ENTITY a "aaaa">]><testsuites/>', b"\xff\xfe<x>"])
def test_a_broken_report_fails_every_test_with_a_reason(text):
    report = junit.parse(text)
    assert report.error and report.cases == {}
    assert report.statuses(["t.py::a"]) == {"t.py::a": "missing"}


def test_a_huge_report_is_refused_unparsed(monkeypatch):
    monkeypatch.setattr(junit, "MAX_BYTES", 100)
    report = junit.parse("<testsuites>" + "<testcase classname='a' name='b'/>" * 10 + "</testsuites>")
    assert "too large" in report.error


def test_junit_parses_what_pytest_writes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_real.py").write_text(textwrap.dedent('''
        import pytest
        class TestK:
            @pytest.mark.parametrize("v", ["a::b", "c/d.py", 1])
            def test_p(self, v):
                assert v != 1
            class TestInner:
                def test_n(self):
                    pass
        def test_plain():
            pass
        '''))
    out = tmp_path / "r.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={out}",
                    "sub/test_real.py"], cwd=tmp_path, capture_output=True, env={**os.environ, **FAST})
    report = junit.parse(out.read_text())
    base = "sub/test_real.py::"
    assert report.statuses([base + "TestK::test_p[a::b]", base + "TestK::test_p[c/d.py]", base + "TestK::test_p[1]",
                            base + "TestK::TestInner::test_n", base + "test_plain"]) == {
        base + "TestK::test_p[a::b]": "passed", base + "TestK::test_p[c/d.py]": "passed",
        base + "TestK::test_p[1]": "failed", base + "TestK::TestInner::test_n": "passed", base + "test_plain": "passed"}


# ---------------------------------------------------------------- what counts as a test path


@pytest.mark.parametrize(("path", "protected"), [
    ("tests/test_a.py", True), ("pkg/tests/data/x.json", True), ("test/x.py", True), ("tests", True),
    ("test_top.py", True), ("pkg/foo_test.py", True), ("sub/conftest.py", True), ("pytest.ini", True),
    ("tox.ini", True), (".gitattributes", True), ("pytest.py", True), ("_pytest/__init__.py", True), ("json/__init__.py", True),
    ("mathx.py", False), ("pkg/testing.py", False), ("docs/tests.md", False), ("setup.cfg", False),
])
def test_protected_paths(path, protected):
    assert is_protected(path, frozenset({"mathx.py", "pkg"})) is protected


def test_a_top_level_module_of_the_base_stays_editable():
    assert not is_protected("json/__init__.py", frozenset({"json"}))


# ---------------------------------------------------------------- grading


@pytest.mark.parametrize("factory", SANDBOXES)
def test_the_gold_patch_resolves(task, factory):
    report = grade_fast(task, task.patch, factory)
    assert report.as_dict() == {"resolved": 1, "f2p": 1.0, "p2p": 1.0, "applied": 1, "touched_tests": 0, "reward": 1.0}
    assert report.apply_method == "git_apply_3way" and report.error is None and report.reward() == 1.0
    assert set(report.tests.values()) == {"passed"} and set(report.tests) == set(F2P + P2P)


def test_the_default_test_environment_grades_too(task):
    """No test_env: the runner's plugins load as they would for a real repository (slower, same verdict)."""
    assert run(grade(task, task.patch, sandbox_factory=LOCAL, budget_s=120)).resolved


def test_an_empty_diff_scores_zero_without_a_sandbox(task):
    def no_sandbox(workdir: Path):
        raise AssertionError("no sandbox for an empty diff")

    report = grade_fast(task, " \n", no_sandbox)
    assert report.as_dict()["resolved"] == 0 and not report.applied and report.reward(partial=True) == 0.0


def test_at_base_f2p_fail_and_p2p_pass(task):
    report = run(evaluate(task, "", sandbox_factory=LOCAL, budget_s=60, test_env=FAST))
    assert report.f2p == 0.0 and report.p2p == 1.0 and not report.resolved and not report.applied
    assert {report.tests[t] for t in F2P} == {"failed"}


@pytest.mark.parametrize("factory", SANDBOXES)
def test_a_wrong_edit_scores_zero(task, tmp_path, factory):
    diff = diff_of(task, tmp_path, {"mathx.py": MATHX.replace("return a - b", "return a * b")})
    report = grade_fast(task, diff, factory)
    assert report.applied and not report.resolved and report.f2p == 0.0 and report.p2p == 1.0


def test_partial_reward_is_the_f2p_fraction_when_nothing_broke(task, tmp_path):
    half = diff_of(task, tmp_path, {"mathx.py": MATHX.replace("return a - b", "return a + b if a else -1")})
    report = grade_fast(task, half, partial=True)
    assert report.f2p == 0.5 and report.p2p == 1.0 and not report.resolved
    assert report.reward() == 0.5 and report.reward(partial=False) == 0.0 and report.as_dict()["reward"] == 0.5
    broke = diff_of(task, tmp_path, {"mathx.py": GOLD.replace("return a * -1", "return a")})
    report = grade_fast(task, broke)
    assert report.f2p == 1.0 and report.p2p == 0.75 and report.reward(partial=True) == 0.0 and not report.resolved


@pytest.mark.parametrize("factory", SANDBOXES)
def test_deleting_the_tests_scores_zero_and_is_flagged(task, tmp_path, factory):
    report = grade_fast(task, diff_of(task, tmp_path, {"tests/test_mathx.py": None}), factory)
    assert report.as_dict()["resolved"] == 0 and report.touched_tests and report.p2p == 1.0
    with_gold = diff_of(task, tmp_path, {"tests/test_mathx.py": None, "mathx.py": GOLD})
    report = grade_fast(task, with_gold, factory)
    assert report.resolved and report.touched_tests  # the tests came back, and the fix passes them


def _fake_junit_writer() -> str:
    cases = "".join(f'<testcase classname="{c}" name="{n}"/>' for c, n in map(junit.junit_key, F2P + P2P))
    return ("import sys\npath = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--junitxml='))\n"
            f"open(path, 'w').write('<testsuites><testsuite>{cases}</testsuite></testsuites>')\n")


def _cheat(cheat: str) -> dict[str, str]:
    return {
        "rewritten_tests": {"tests/test_add.py": fake_test_file(F2P), "tests/test_mathx.py": fake_test_file(P2P)},
        "conftest_hook": {"conftest.py": textwrap.dedent('''
            import pytest
            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_makereport(item, call):
                outcome = yield
                outcome.get_result().outcome = "passed"
            ''')},
        "shadow_pytest": {"pytest.py": _fake_junit_writer()},
    }[cheat]


@pytest.mark.parametrize("cheat", ["rewritten_tests", "conftest_hook", "shadow_pytest"])
def test_editing_tests_to_pass_scores_zero(task, tmp_path, cheat):
    report = grade_fast(task, diff_of(task, tmp_path, _cheat(cheat)))
    assert report.applied and report.touched_tests and not report.resolved and report.f2p == 0.0, report


@pytest.mark.parametrize("cheat", ["conftest_hook", "shadow_pytest"])
def test_those_cheats_would_work_if_nothing_were_protected(task, tmp_path, cheat, monkeypatch):
    """The attacks above are real: only the restoring of protected paths stops them."""
    from slimecli.swe import grade as grade_module

    monkeypatch.setattr(grade_module, "is_protected", lambda path, base_top=frozenset(): False)
    assert grade_fast(task, diff_of(task, tmp_path, _cheat(cheat))).resolved


def test_skipping_from_the_code_under_test_earns_nothing(task, tmp_path):
    skip = "import pytest\npytest.skip('later', allow_module_level=True)\n"
    report = grade_fast(task, diff_of(task, tmp_path, {"mathx.py": skip + GOLD}))
    assert report.applied and not report.touched_tests and not report.resolved and report.f2p == 0.0


def test_a_diff_that_needs_the_three_way_merge(task, tmp_path):
    """Setup changes a line next to the fix: plain `git apply` refuses the context, the 3-way merge does not."""
    edited = SweTask(**{**task.__dict__, "setup_commands": ("sed -i 's/^VERSION = .*/VERSION = \"dev\"/' mathx.py",)})
    near = diff_of(task, tmp_path, {"mathx.py": MATHX.replace('"""Tiny arithmetic."""', '"""Tiny sums."""')
                                    .replace("return a - b", "return a + b")})
    work = tmp_path / "plain"
    work.mkdir()
    prepare(task, work)
    (work / "mathx.py").write_text(MATHX.replace('VERSION = "1.0"', 'VERSION = "dev"'))
    plain = subprocess.run(["git", "apply", "--check", "-"], cwd=work, input=near, text=True, capture_output=True)
    assert plain.returncode != 0  # what the 3-way rung is for
    report = grade_fast(edited, near)
    assert report.resolved and report.apply_method == "git_apply_3way"


def test_a_diff_with_stale_context_falls_back_to_patch(task):
    if shutil.which("patch") is None:
        pytest.skip("no `patch` program on this machine")
    stale = task.patch.replace(" def neg(a):", " def negate(a):")
    assert stale != task.patch
    report = grade_fast(task, stale)
    assert report.resolved and report.apply_method == "patch"


def test_a_diff_that_does_not_apply_scores_zero(task):
    report = grade_fast(task, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n")
    assert not report.applied and not report.resolved and "does not apply" in report.error


def test_broken_code_is_a_zero_not_unevaluatable(task, tmp_path):
    syntax = grade_fast(task, diff_of(task, tmp_path, {"mathx.py": MATHX + "\ndef broken(:\n"}))
    assert not syntax.resolved and syntax.f2p == 0.0 and syntax.p2p == 0.0
    crash = grade_fast(task, diff_of(task, tmp_path, {"mathx.py": "import os\nos._exit(0)\n" + GOLD}))
    assert not crash.resolved and crash.f2p == 0.0 and "no report" in crash.error


def test_custom_test_commands(task):
    junit_cmd = SweTask(**{**task.__dict__, "test_cmd": "python -m pytest -q -o addopts= --junitxml={junit} {tests}"})
    assert grade_fast(junit_cmd, task.patch).resolved
    status_only = SweTask(**{**task.__dict__, "test_cmd": "python -m pytest -q -o addopts= {ids}"})
    assert grade_fast(status_only, task.patch).resolved
    assert not grade_fast(status_only, task.patch.replace("a + b", "a * b")).resolved


@pytest.mark.parametrize(("change", "reason"), [
    ({"workdir": "/nonexistent/repo"}, "workspace"),
    ({"base_commit": "0" * 40}, "workspace"),
    ({"setup_commands": ("exit 3",)}, "setup"),
    ({"setup_commands": ("sleep 30",)}, "timeout"),
    ({"test_patch": "diff --git a/tests/test_mathx.py b/tests/test_mathx.py\n--- a/tests/test_mathx.py\n"
                    "+++ b/tests/test_mathx.py\n@@ -1 +1 @@\n-nothing like this\n+x\n"}, "test_patch"),
    ({"fail_to_pass": ("tests/test_gone.py::test_x",)}, "test_files"),
])
def test_what_cannot_be_graded_is_unevaluatable(task, change, reason):
    broken = SweTask(**{**task.__dict__, **change})
    with pytest.raises(Unevaluatable) as info:
        grade_fast(broken, task.patch, budget_s=1 if reason == "timeout" else 60)
    assert info.value.reason == reason


def test_a_hanging_test_run_is_a_timeout(task, tmp_path):
    hang = diff_of(task, tmp_path, {"mathx.py": GOLD.replace("return a + b", "while True:\n        pass")})
    with pytest.raises(Unevaluatable) as info:
        grade_fast(task, hang, budget_s=3)
    assert info.value.reason == "timeout"


def test_no_test_runner_is_unevaluatable(task, tmp_path):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python").write_text("#!/bin/sh\necho 'No module named pytest' >&2\nexit 1\n")
    (shim / "python").chmod(0o755)
    with pytest.raises(Unevaluatable) as info:
        grade_fast(task, task.patch, sandbox_of("local", path_dirs=(str(shim),)))
    assert info.value.reason == "runner"


def test_a_sandbox_that_cannot_start_is_unevaluatable(task):
    def failing(workdir: Path):
        raise OSError("no such runtime")

    with pytest.raises(Unevaluatable) as info:
        grade_fast(task, task.patch, failing)
    assert info.value.reason == "sandbox"


def test_the_sandbox_is_closed_and_the_workspace_removed(task):
    made = []

    def tracked(workdir: Path):
        made.append(LOCAL(workdir))
        return made[-1]

    grade_fast(task, task.patch, tracked)
    with pytest.raises(Unevaluatable):
        grade_fast(SweTask(**{**task.__dict__, "setup_commands": ("exit 1",)}), task.patch, tracked)
    assert len(made) == 2 and not any(s.workdir.exists() for s in made)


def test_the_limiter_bounds_concurrent_gradings(task):
    with pytest.raises(ValueError):
        GradeLimiter(0)

    async def both() -> list[GradeReport]:
        limiter = GradeLimiter(1)
        return list(await asyncio.gather(*(grade(task, task.patch, sandbox_factory=LOCAL, budget_s=60,
                                                 limiter=limiter, test_env=FAST) for _ in range(2))))

    assert [r.resolved for r in run(both())] == [True, True]


@pytest.mark.parametrize("factory", SANDBOXES)
def test_capture_diff_takes_untracked_files_and_leaves_the_harness_out(task, tmp_path, factory):
    work = tmp_path / "agent"
    work.mkdir()
    prepare(task, work)
    sandbox = factory(work)
    try:
        sandbox.write_file("PROBLEM_STATEMENT.md", "add() subtracts")
        sandbox.write_file("_impl.py", "def plus(a, b):\n    return a + b\n")
        sandbox.write_file("mathx.py", GOLD.replace("def add(a, b):\n    return a + b",
                                                    "from _impl import plus as add"))
        diff = run(capture_diff(sandbox))
    finally:
        sandbox.close()
    assert "_impl.py" in diff and "PROBLEM_STATEMENT" not in diff
    assert grade_fast(task, diff, factory).resolved


# ---------------------------------------------------------------- task checks


def test_file_diff_round_trips_through_git_apply(tmp_path):
    (tmp_path / "keep.txt").write_text("a\nb")
    git("init", "-q", ".", cwd=tmp_path)
    diff = file_diff("keep.txt", "a\nb", "a\nc\n") + file_diff("new.py", None, "x = 1\n")
    git("apply", "-", cwd=tmp_path, input=diff)
    assert (tmp_path / "keep.txt").read_text() == "a\nc\n" and (tmp_path / "new.py").read_text() == "x = 1\n"
    git("apply", "-", cwd=tmp_path, input=file_diff("new.py", "x = 1\n", None))
    assert not (tmp_path / "new.py").exists()


def test_check_task_passes_a_valid_task(task):
    result = run(check_task(task, sandbox_factory=LOCAL, budget_s=60, test_env=FAST))
    assert result.ok, result.why
    assert [c.name for c in result.checks] == ["base", "gold", "empty_diff", "delete_tests", "fake_tests"]
    assert result.as_dict()["ok"] is True


def test_check_task_names_what_is_wrong_with_a_broken_task(task):
    solved = SweTask(**{**task.__dict__, "fail_to_pass": ("tests/test_mathx.py::test_mul",),
                        "pass_to_pass": ("tests/test_add.py::test_add",)})
    result = run(check_task(solved, sandbox_factory=LOCAL, budget_s=60, test_env=FAST))
    assert not result.ok
    assert "base" in {c.name for c in result.checks if not c.ok}
    assert "tests/test_mathx.py::test_mul (passed)" in result.why


BUILTIN = load("builtin:swe_tiny").tasks


@pytest.fixture(scope="module")
def builtin_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLIMECLI_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.mark.parametrize("builtin_task", BUILTIN, ids=[t.instance_id for t in BUILTIN])
def test_every_builtin_task_checks(builtin_task, builtin_cache):
    result = run(check_task(builtin_task, sandbox_factory=LOCAL, budget_s=120, test_env=FAST))
    assert result.ok, result.why
