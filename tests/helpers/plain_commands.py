"""Every `slimecli` command, run as a user of a plain install runs it: `--help` of each, and a real, small invocation
of each that needs no outside service. tests/test_plain_install.py runs them in the plain install of this
checkout (tests/helpers/plain_venv.py); bench/check_plain_install.py in a venv installed from the package
registry.

INVOCATIONS names each command by its path in the `--help` tree; a command the tree shows without an entry here
fails the test. Each runs in a stage: the commands of a stage at once, the stages in order (a later one uses
what an earlier one made: a run, a task file, task environments). A server runs until its `ready` text is
printed, then gets SIGINT.

EXTRA_PROBES does for each extra what needs it: without the extra, exit 2 and one line that names it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.scripted_claude import scripted_claude

DATA = Path(__file__).resolve().parents[1] / "data"
SDIST = "tinystats-0.1.0"  # a small project whose tests pass: what `tasks synth` makes tasks from
SERVER_TIMEOUT_S = 120.0
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Invocation:
    args: tuple[str, ...]  # after `slimecli`
    stage: int = 0
    ready: str = ""  # a server: the text its output shows once it serves
    extra: str = ""  # exits 2 naming slimecli[extra]


@dataclass
class Result:
    invocation: Invocation
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    ready: bool = False

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Workspace:
    """What the invocations share: a directory of their own, the run, the task files and environments."""

    root: Path
    python: Path  # the plain install's interpreter (runs the stand-in agent CLI)
    files: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.files.update(run=self.root / "run", tasks=self.root / "synth" / "tasks.jsonl",
                          envs=self.root / "task-envs", sdist=self._sdist(), fake_claude=self._fake_claude(),
                          parquet=self.root / "rows.parquet", model=self.root / "tiny-model",
                          recipe=self.root / "my-recipe.yaml", patch=self.root / "gold.diff")
        self.files["parquet"].write_bytes(b"PAR1 not read without pyarrow")

    def _sdist(self) -> Path:
        """The shipped project as an sdist archive (name-version/ inside, as `python -m build --sdist` makes)."""
        archive = self.root / f"{SDIST}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(DATA / SDIST, arcname=SDIST, filter=lambda info: None if "__pycache__" in info.name else info)
        return archive

    def _fake_claude(self) -> Path:
        """A stand-in for the Claude Code CLI: one Messages API call to the adapter, its text printed."""
        path = self.root / "fake-claude"
        path.write_text(scripted_claude(self.python))
        path.chmod(0o755)
        return path


def invocations(ws: Workspace) -> dict[tuple[str, ...], list[Invocation]]:
    f = ws.files
    run, tasks, envs = str(f["run"]), str(f["tasks"]), f"task.env_dir={f['envs']}"
    on_tasks = [f"task.path={tasks}", envs]
    instance = "ID"  # the task `tasks synth` made (known from stage 1 on)
    if f["tasks"].is_file():
        import json

        instance = json.loads(f["tasks"].read_text().splitlines()[0])["instance_id"]

    def inv(*args: str, stage: int = 0, ready: str = "") -> Invocation:
        return Invocation(tuple(args), stage, ready)

    return {
        ("train",): [inv("train", "trainer.lora.rank=8", "trainer.max_steps=2", "rollout.dump=true", f"run.dir={run}"),
                     inv("train", f"run.dir={run}", stage=1),  # the bare resume: complete, its settings kept
                     inv("train", "trainer.lora.rank=8", "trainer.max_steps=2", f"rollout.replay={run}",
                         f"run.dir={ws.root / 'replay'}", stage=1)],  # the dumped samples, no engine
        ("eval",): [inv("eval", f"run.dir={run}", stage=1)],
        ("report",): [inv("report", run, stage=1)],
        ("plan",): [inv("plan", "trainer.lora.rank=8")],
        ("config", "show"): [inv("config", "show", "+recipe=env_lookup")],
        ("config", "validate"): [inv("config", "validate", "optimizer=stateless_adam")],
        ("recipes", "list"): [inv("recipes", "list")],
        ("recipes", "show"): [inv("recipes", "show", "quickstart")],
        ("recipes", "copy"): [inv("recipes", "copy", "quickstart", str(f["recipe"]))],
        ("rollout", "serve"): [inv("rollout", "serve", ready="slimecli engine ready on")],
        ("rollout", "reverify"): [inv("rollout", "reverify", run, "reward=exact_match", stage=1)],
        ("teacher", "serve"): [inv("teacher", "serve", "teacher.port=auto", ready="teacher is ready")],
        ("model", "init"): [inv("model", "init", str(f["model"]))],
        ("agent", "serve"): [inv("agent", "serve", "agent=claude_code", ready="ANTHROPIC_BASE_URL=")],
        ("agent", "run"): [inv("agent", "run", "agent=claude_code", f"agent.binary={f['fake_claude']}",
                               "sandbox=local", "task.prompt=Say hello.",
                               f"agent.output={ws.root / 'agent' / 'samples.jsonl'}")],
        ("agent", "install"): [inv("agent", "install", "claude_code", "--print", "--dir", str(ws.root / "tools"))],
        ("tasks", "list"): [inv("tasks", "list")],
        ("tasks", "synth"): [inv("tasks", "synth", str(f["sdist"]), "--out", tasks, "--max", "1", envs)],
        ("tasks", "stats"): [inv("tasks", "stats", "builtin:swe_tiny"), inv("tasks", "stats", tasks, envs, stage=1)],
        ("tasks", "check"): [inv("tasks", "check", *on_tasks, stage=1)],
        ("tasks", "grade"): [inv("tasks", "grade", *on_tasks, f"task.instance={instance}", "--patch", str(f["patch"]),
                              stage=2)],
        ("tasks", "env", "build"): [inv("tasks", "env", "build", *on_tasks, stage=1)],
        ("tasks", "env", "list"): [inv("tasks", "env", "list", envs, stage=2)],
        ("tasks", "env", "prune"): [inv("tasks", "env", "prune", envs, stage=3)],
        ("env", "list"): [inv("env", "list")],
        ("env", "check"): [inv("env", "check", "env=native", "env.id=lookup")],
        ("env", "run"): [inv("env", "run", "env=native", "env.id=lookup", "--episodes", "1")],
    }


def extra_probes(ws: Workspace) -> dict[str, Invocation]:
    """Per extra (pyproject's optional-dependencies with packages of their own): a command that needs it."""
    def needs(extra: str, *args: str) -> Invocation:
        return Invocation(tuple(args), extra=extra)

    rows = [f"task.path={DATA / SDIST / 'pyproject.toml'}"]  # any file: the environment is refused before reading it
    return {
        "datasets": needs("datasets", "tasks", "stats", str(ws.files["parquet"])),
        "megatron": needs("megatron", "config", "validate", "trainer=megatron"),
        "sglang": needs("sglang", "config", "validate", "rollout=sglang"),
        "wandb": needs("wandb", "config", "validate", "observe.wandb=true"),
        "verifiers": needs("verifiers", "config", "validate", "env=verifiers", "env.id=some-taskset", "task=jsonl", *rows),
        "openenv": needs("openenv", "config", "validate", "env=openenv", "env.id=echo_env", "task=jsonl", *rows),
        "skyrl-gym": needs("skyrl-gym", "config", "validate", "env=skyrl_gym", "env.id=gsm8k", "task=jsonl", *rows),
        "reasoning-gym": needs("reasoning-gym", "config", "validate", "env=reasoning_gym", "env.id=chain_sum",
                               "task=jsonl", *rows),
    }


SERVER_EXITS = (0, 130)  # a server stopped by SIGINT (Ctrl-C): 0, or 128 + SIGINT where it was mid-start


def run_one(slimecli: Path, invocation: Invocation, cwd: Path, env: dict[str, str]) -> Result:
    """One invocation; a server until it is ready (then SIGINT), at most SERVER_TIMEOUT_S."""
    start = time.monotonic()
    if not invocation.ready:
        try:
            proc = subprocess.run([str(slimecli), *invocation.args], capture_output=True, text=True, cwd=cwd,
                                  env=env, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return Result(invocation, None, str(exc.stdout or ""), str(exc.stderr or ""), time.monotonic() - start)
        return Result(invocation, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)
    server = subprocess.Popen([str(slimecli), *invocation.args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    assert server.stdout is not None
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in server.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if invocation.ready in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready = seen.wait(SERVER_TIMEOUT_S)
    if server.poll() is None:
        server.send_signal(signal.SIGINT)  # as Ctrl-C: the server stops what it started and exits
    try:
        code = server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        code = server.wait()
    reader.join(timeout=10)
    return Result(invocation, code, "".join(lines), "", time.monotonic() - start, ready=ready)


def prepare_stage(ws: Workspace, stage: int) -> None:
    """What a stage needs from the ones before: the gold patch of the task `tasks synth` made."""
    if stage == 2 and ws.files["tasks"].is_file():
        import json

        row = json.loads(ws.files["tasks"].read_text().splitlines()[0])
        ws.files["patch"].write_text(row["patch"])


def run_all(slimecli: Path, ws: Workspace, jobs: int = 3,
            each: Callable[[Result], None] | None = None) -> dict[tuple[str, ...], list[Result]]:
    """Every invocation (stage by stage, ``jobs`` at once), by command path; ``each`` sees each result as it ends."""
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    env.pop("SWE_AGENT", None)
    results: dict[tuple[str, ...], list[Result]] = {path: [] for path in invocations(ws)}
    for stage in sorted({i.stage for items in invocations(ws).values() for i in items}):
        prepare_stage(ws, stage)
        table = invocations(ws)  # with what the stages before made (the synthesised task's id)
        todo = [(path, i) for path, items in table.items() for i in items if i.stage == stage]
        with ThreadPoolExecutor(jobs) as pool:
            done = pool.map(lambda item: (item[0], run_one(slimecli, item[1], ws.root, env)), todo)
            for path, result in done:
                results[path].append(result)
                if each is not None:
                    each(result)
    return results


def help_of(slimecli: Path, cwd: Path) -> Callable[[list[str]], str]:
    """`slimecli PATH --help`'s output at a width that wraps nothing, for cli_tree.command_tree; an exit other
    than 0 fails with its output."""
    def show(path: list[str]) -> str:
        proc = subprocess.run([str(slimecli), *path, "--help"], capture_output=True, text=True, cwd=cwd,
                              env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}, timeout=120)
        if proc.returncode != 0 or "Traceback" in proc.stdout + proc.stderr:
            raise AssertionError(f"slimecli {' '.join(path)} --help exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc.stdout

    return show


def traceback_free(text: str) -> bool:
    return "Traceback (most recent call last)" not in text
