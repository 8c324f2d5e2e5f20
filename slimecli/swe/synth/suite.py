"""Running the repository's tests during synthesis: in the task's environment, in the configured sandbox.

Each worker owns a plain copy of the clean tree and a sandbox over it; a candidate is tried by writing the broken
file, running the test files that cover it, and writing the clean file back. Bytecode is never written (a
mutation that keeps a file's size within the same second would otherwise run the stale clean .pyc), and hash
randomisation is off, so the messages of a failing test are the same on every run.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slimecli.sandbox.base import Sandbox

RESULT = ".slimecli-synth-probe.json"  # in the worker's tree, written by the probe
# The probe is a pytest plugin for the task's interpreter, which has pytest; slimecli's need not: it is copied by
# path, never imported here.
PROBE_FILE = Path(__file__).with_name("probe.py")
PROBE_MODULE = "slimecli_synth_probe"
RUNNER = ("python", "-m", "pytest", "-p", PROBE_MODULE, "-p", "no:cacheprovider", "-o", "addopts=", "-q",
          "--continue-on-collection-errors", "-W", "ignore::DeprecationWarning")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_TEMP = re.compile(re.escape(tempfile.gettempdir().rstrip("/")) + r"/slimecli-[\w.-]+")  # sandbox homes, workers


class SuiteError(Exception):
    """The suite cannot be run here at all (the runner is missing, the probe could not report)."""


@dataclass
class Outcome:
    status: str  # passed | failed | error | skipped
    message: str = ""


@dataclass
class SuiteRun:
    tests: dict[str, Outcome] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    # file -> line -> the node ids of the tests that ran it ("" : run at import or collection)
    coverage: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    timed_out: bool = False
    output: str = ""

    def passing(self) -> set[str]:
        return {t for t, o in self.tests.items() if o.status == "passed"}


def make_probe_dir(dest: Path) -> Path:
    """The probe plugin and coverage.py (a dependency of slimecli), importable from `dest` by the task's
    interpreter (the same Python as slimecli's: venvs are made from it)."""
    import coverage

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROBE_FILE, dest / f"{PROBE_MODULE}.py")
    shutil.copytree(Path(coverage.__file__).parent, dest / "coverage", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def clean_message(text: str, root: Path) -> str:
    """What a user of any checkout would see: no worker path, no memory address."""
    text = text.replace(str(root) + "/", "").replace(str(root), ".")
    return _TEMP.sub("<tmp>", _ADDRESS.sub("0x...", text))


class Worker:
    def __init__(self, root: Path, tree: Path, probe_dir: Path, sandboxes: Callable[[Path], Sandbox]) -> None:
        self.root = root
        shutil.copytree(tree, root, symlinks=True)
        self.probe_dir = probe_dir
        self.sandbox = sandboxes(root)

    def close(self) -> None:
        self.sandbox.close()

    async def run(self, files: list[str] | None, timeout_s: float, cover: bool = False) -> SuiteRun:
        """The given test files (None: the whole suite, as its configuration collects it)."""
        result_file = self.root / RESULT
        result_file.unlink(missing_ok=True)
        env = {"PYTHONPATH": str(self.probe_dir), "SLIMECLI_PROBE_OUT": RESULT, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "SLIMECLI_PROBE_COVER": "1" if cover else "0"}
        argv = [*RUNNER, *(["--", *files] if files else [])]
        start = time.monotonic()
        done = await self.sandbox.exec(argv, timeout_s=timeout_s, env=env)
        run = SuiteRun(elapsed_s=time.monotonic() - start, timed_out=bool(done.timed_out or done.returncode is None),
                       output=(done.stdout + done.stderr)[-3000:])
        if run.timed_out:
            return run
        if done.returncode in (126, 127):
            raise SuiteError(f"the test runner cannot start here: {run.output.strip()[-600:]}")
        try:
            data = json.loads(result_file.read_text())
        except (OSError, ValueError):
            if cover:
                raise SuiteError(f"the suite did not report (exit {done.returncode}): {run.output.strip()[-600:]}") \
                    from None
            return run  # the broken code killed the interpreter: every test it ran counts as not passing
        finally:
            result_file.unlink(missing_ok=True)
        run.tests = {t: Outcome(o["outcome"], clean_message(o["message"], self.root)) for t, o in data["tests"].items()}
        run.collect_errors = {k: clean_message(v, self.root) for k, v in data["collect_errors"].items()}
        contexts = data.get("contexts", [])
        for path, lines in data.get("coverage", {}).items():
            run.coverage[path] = {int(n): {contexts[i] for i in idx} for n, idx in lines.items()}
        return run

    def write(self, path: str, content: bytes) -> None:
        (self.root / path).write_bytes(content)
