"""Every `slimecli ...` line in a fenced code block of README.md and docs/*.md is checked, so the docs cannot
drift from the CLI: every line of a ```bash block (after `VAR=value` prefixes), and `$ slimecli ...` lines of
other blocks (transcripts). A test id names the doc and the line.

Checked cheaply, in this interpreter, nothing launched: a command that takes overrides (`train`, `plan`,
`config show|validate`, `eval`, `teacher serve`, `rollout serve`, `agent run|serve`, `tasks ...`) must compose
and validate with `slimecli.config.compose.load` exactly as the command would; `recipes ...`, `agent install`
(with `--print`) and `--help` forms run through typer's runner and must exit 0. A line whose comment says
`# exit 2` must fail with config errors instead. Placeholders (DIR, /ckpt, RUN, NAME, DST) stand for real
paths and names here. The pre-flight checks that need this machine (ports, GPUs, installed CLIs) are not
part of composition, so they do not matter here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import invoke_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Commands composed as the CLI composes them: (words) -> uses_agent.
COMPOSED = {
    ("train",): False, ("plan",): False, ("config", "show"): False, ("config", "validate"): False,
    ("eval",): False, ("teacher", "serve"): False, ("rollout", "serve"): False,
    ("agent", "run"): True, ("agent", "serve"): True,
    ("tasks", "list"): False, ("tasks", "check"): False, ("tasks", "grade"): False,
    ("env", "check"): False, ("env", "run"): False,  # tests/test_cli_env.py runs them
}
# Options of those commands that take a value (dropped with it before composing).
VALUE_OPTIONS = {"--patch", "--index", "--recipe-dir", "-r", "--out", "--by", "--seeds", "--dir", "--episodes", "--url"}

# Lines not checked, each with the reason. Keep it small.
SKIPPED = {
    ("report",): "needs a finished run; tests of slimecli report write one",
    ("model", "init"): "writes a model (seconds); the `tiny` fixture runs the same create_tiny_model",
    ("tasks", "synth"): "makes tasks from a repository (a minute or more); tests/test_swe_synth.py runs it",
    ("rollout", "reverify"): "needs a run's rollout dumps; tests/test_rollout_replay.py makes and reverifies one",
}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str
    env: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    expect_exit: int

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def _commands() -> list[Command]:
    found = []
    for path in DOCS:
        in_block, shell = False, False
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            number, raw = i + 1, lines[i]
            i += 1
            if raw.lstrip().startswith("```"):
                in_block = not in_block
                shell = raw.strip().removeprefix("```") in ("bash", "sh", "shell")
                continue
            text = raw.strip()
            if not in_block or not (shell or text.startswith("$ ")):
                continue  # outside a shell block, only `$ slimecli ...` lines are commands
            while text.endswith("\\") and i < len(lines):
                text = text[:-1] + " " + lines[i].strip()
                i += 1
            text = text.removeprefix("$ ")
            words = shlex.split(text, comments=True) if "slimecli" in text else []
            env = []
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                env.append(tuple(words.pop(0).split("=", 1)))
            if not words or words[0] != "slimecli":
                continue
            m = re.search(r"\s#\s*exit (\d+)\b", text)
            found.append(Command(str(path.relative_to(ROOT)), number, text, tuple(env), tuple(words[1:]),
                                 int(m.group(1)) if m else 0))
    return found


COMMANDS = _commands()


def test_docs_have_commands():
    assert len(COMMANDS) >= 30, [str(c) for c in COMMANDS]
    assert any(c.doc == "README.md" for c in COMMANDS)


@pytest.fixture(scope="module")
def places(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real values for the docs' placeholders: a model directory, a finished-looking run, a destination, and a
    working directory holding the data files the docs name (test.jsonl, gsm.jsonl, swe.jsonl, tasks.jsonl,
    iso.jsonl, fix.diff)."""
    import shutil

    import slimecli
    from slimecli.config.compose import load
    from slimecli.config.io import save_frozen

    cwd = tmp_path_factory.mktemp("docs")
    for name in ("test.jsonl", "gsm.jsonl"):
        (cwd / name).write_text('{"prompt": "1 + 1 =", "label": "2"}\n')
    shutil.copyfile(Path(slimecli.__file__).parent / "swe/data/swe_tiny/tasks.jsonl", cwd / "swe.jsonl")
    for name in ("tasks.jsonl", "iso.jsonl"):  # what `tasks synth --choices 3` writes for the smoke recipe
        shutil.copyfile(Path(slimecli.__file__).parent / "swe/data/swe_tiny_smoke/tasks.jsonl", cwd / name)
    (cwd / "fix.diff").write_text("")
    shutil.copyfile(ROOT / "recipes" / "quickstart.yaml", cwd / "my.yaml")  # `+recipe=./my.yaml`
    run = cwd / "run"
    save_frozen(load([]), run / "config.yaml")
    (run / "final").symlink_to(tiny, target_is_directory=True)
    return {"model": str(tiny), "run": str(run), "dst": str(cwd / "my.yaml"), "cwd": str(cwd)}


def _value(value: str, places: dict[str, str]) -> str:
    if value == "RUN":
        return places["run"]
    if value == "NAME":
        return "quickstart"
    if value == "DIR" or value.startswith(("/ckpt", "RUN/")):
        return places["model"]
    return value


def _overrides(args: tuple[str, ...], places: dict[str, str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in VALUE_OPTIONS:
            skip = True
        elif arg.startswith("-"):
            continue
        else:
            key, eq, value = arg.partition("=")
            out.append(f"{key}{eq}{_value(value, places)}" if eq else arg)
    return out


def _split(args: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the command's words, the rest)."""
    for n in (2, 1):
        if args[:n] in COMPOSED or args[:n] in SKIPPED:
            return args[:n], args[n:]
    return args[:1], args[1:]


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
def test_docs_command(cmd: Command, places: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    from slimecli.config.compose import AGENT_ENV
    from slimecli.config.errors import ConfigErrors
    from slimecli.launch.source_checks import load  # as the commands read a config: the files it names too

    words, rest = _split(cmd.args)
    if words in SKIPPED:
        pytest.skip(SKIPPED[words])
    monkeypatch.delenv(AGENT_ENV, raising=False)
    for key, value in cmd.env:
        monkeypatch.setenv(key, value)
    if "--help" in rest or "-h" in rest or words not in COMPOSED:
        args = [{"NAME": "quickstart", "DST": places["dst"]}.get(a, a) for a in cmd.args]
        if words == ("agent",) and rest[:1] == ("install",):
            args.append("--print")  # the npm command, not the download (`make agent-clis` runs that)
        if words == ("recipes",) and rest[:1] == ("copy",):
            args.append("--force")  # over the fixture's my.yaml
        result = invoke_cli(*args, cwd=places["cwd"])
        assert result.returncode == cmd.expect_exit, f"{cmd}: {cmd.text}\n{result.stdout}\n{result.stderr}"
        return
    overrides = _overrides(rest, places)
    if words[0] == "tasks" and not any(o.split("=", 1)[0] == "task" for o in overrides):
        overrides.insert(0, "task=swe")  # as slimecli/cli/tasks.py does
    recipe_dirs = tuple(_value(v, places) for k, v in zip(rest, rest[1:], strict=False) if k in ("--recipe-dir", "-r"))
    if words == ("eval",) and any(o.startswith("run.dir=") for o in overrides):
        from slimecli.eval.standalone import resolve

        def check() -> object:
            return resolve(overrides, recipe_dirs)
    else:
        def check() -> object:
            return load(overrides, recipe_dirs, COMPOSED[words])
    monkeypatch.chdir(places["cwd"])
    if cmd.expect_exit == 2:
        with pytest.raises(ConfigErrors):
            check()
        return
    assert cmd.expect_exit == 0, f"{cmd}: only exit 0 or 2 can be checked by composing"
    try:
        check()
    except ConfigErrors as exc:
        pytest.fail(f"{cmd}: {cmd.text}\n{exc.render()}")


def test_readme_says_what_make_test_does():
    """The README's account of `make test` (what CI runs): set-up with megatron-core, wandb, the agent CLIs and
    bubblewrap, then ruff, mypy and pytest over the whole suite, nothing deselected."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    m = re.search(r"^test:(.*)\n((?:\t.*\n?)+)", makefile, re.MULTILINE)
    assert m, "no test target in the Makefile"
    prerequisites, recipe = m.group(1).split(), m.group(2)
    deps = re.search(r"^test-deps:(.*)$", makefile, re.MULTILINE)
    # the venv with everything the tests import (one pip run), then the other test-only installs side by side
    assert prerequisites == ["$(BIN)/.installed-megatron"] and deps and "test-deps" in recipe
    for name in ("agent-clis", "sandbox-deps", "sglang-contract"):
        assert name in deps.group(1).split(), name
    venv = re.search(r"^\$\(BIN\)/\.installed-megatron:.*\n((?:\t.*\n?)+)", makefile, re.MULTILINE)
    assert venv and '"$(TORCH)" -e ".[dev,megatron,wandb,envs]"' in venv.group(1), "the test venv's one pip run"
    assert "$(BIN)/.installed " in venv.group(1), "the test venv is also the user's set-up (make setup)"
    assert "ruff check ." in recipe and "mypy" in recipe
    pytest_args = next(line for line in recipe.splitlines() if " pytest" in line).partition(" pytest")[2]
    assert not re.search(r"(^|\s)(-m|-k|--deselect|--ignore)\b|\stests/\S", pytest_args), pytest_args
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make test     # set up (plus test tools, megatron-core and the agent CLIs) and run the whole test suite" in readme
    assert "`make test` is what CI runs" in readme


def test_readme_lists_every_group_member_and_recipe():
    """The README's tables name every member of every group in conf/ and every recipe in recipes/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 2:
            rows.setdefault(cells[0], cells[1])
    for group in sorted(p for p in (ROOT / "conf").iterdir() if p.is_dir()):
        assert group.name in rows, f"group {group.name} missing from the README's table"
        listed = {m.strip(" *") for m in rows[group.name].split(",")}
        assert listed == {m.stem for m in group.glob("*.yaml")}, group.name
    for recipe in (ROOT / "recipes").glob("*.yaml"):
        assert recipe.stem in rows, f"recipe {recipe.stem} missing from the README's table"
