"""What one agent run works on: its workspace, its prompt, and how the finished work is scored.

A plain prompt job (`agent run task.prompt=...`) scores nothing; a SWE job prepares the task's repository
at its base commit, hands the agent the problem statement, and grades the agent's diff in a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimecli.config.groups.sandbox import SandboxConfig
    from slimecli.sandbox.base import Sandbox
    from slimecli.swe.env.resolve import TaskEnv
    from slimecli.swe.task import SweTask

PROBLEM_FILE = "PROBLEM_STATEMENT.md"
SWE_PROMPT = """You are working in the git repository in the current directory ({workdir}).
A user reported the issue below (also in {problem_file}). Change the source code so that the issue is fixed.
Do not modify, add or delete tests, and do not commit: your uncommitted change is what gets reviewed.

{problem}"""


class JobAborted(Exception):
    """The run cannot yield a trainable sample; `reason` becomes the sample's abort_reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class AgentJob:
    """Base: an empty workspace (or the caller's directory), a fixed prompt, a fixed reward."""

    graded = False  # score() runs something (tests) worth telling a user about, not a fixed reward

    def __init__(self, prompt: str, workdir: str | None = None, reward: Any = 0.0) -> None:
        self.text = prompt  # what the sample records as its prompt
        self.workdir = workdir
        self.reward = reward
        self.metadata: dict[str, Any] = {}
        self.choices: list[Any] | None = None  # agent.constrain=choices: the alternatives a turn may take

    def workspace(self) -> Path | None:
        """The directory the sandbox works in; None lets the sandbox make an empty one."""
        if self.workdir is None:
            return None
        if not Path(self.workdir).is_dir():
            raise JobAborted("missing_image_or_workdir", f"task.workdir={self.workdir} is not a directory")
        return Path(self.workdir)

    def sandbox_paths(self) -> tuple[list[str], list[str]]:
        """(read-only paths, PATH directories first) the job's sandbox needs, after workspace() ran."""
        return [], []

    def sandbox_image(self) -> str | None:
        """The container image the job's sandbox runs (sandbox=podman|docker), None for the configured one."""
        return None

    def prompt(self, sandbox: Sandbox) -> str:
        return self.text

    async def setup(self, sandbox: Sandbox) -> None:
        """Anything the workspace needs before the CLI starts."""

    async def score(self, sandbox: Sandbox) -> Any:
        """The run's reward, from the agent's sandbox (still open); raise JobAborted when it cannot be scored."""
        return self.reward

    def cleanup(self) -> None:
        """Remove what workspace() created."""


class SweJob(AgentJob):
    """One SWE task: repository at base_commit, problem statement file, diff graded by the hidden tests."""

    graded = True

    def __init__(self, task: SweTask, *, grade_sandbox: Callable[[Path], Sandbox] | None = None,
                 eval_budget_s: float, partial: bool = False, limiter: asyncio.Semaphore | None = None,
                 environment: Callable[[SweTask], TaskEnv] | None = None,
                 sandbox_settings: SandboxConfig | None = None) -> None:
        """`environment(task)`: the task's environment (built when missing), shared by the agent's sandbox and
        the grader's (made from `sandbox_settings`); without it both run in slimecli's own interpreter."""
        super().__init__(task.problem_statement)
        self.task = task
        self.grade_sandbox = grade_sandbox
        self.environment = environment
        self.sandbox_settings = sandbox_settings
        self.env: TaskEnv | None = None
        self.eval_budget_s = eval_budget_s
        self.partial = partial
        self.limiter = limiter
        self._tmp: Path | None = None
        self.metadata = {"instance_id": task.instance_id}
        self.choices = task.extra.get("choices")  # smoke tasks list well-formed edits, one of them correct

    def workspace(self) -> Path:
        from slimecli.swe.workspace import WorkspaceError, prepare

        if self.environment is not None and self.env is None:
            self._resolve_environment()
        self._tmp = Path(tempfile.mkdtemp(prefix="slimecli-swe-"))
        dest = self._tmp / "workspace"
        dest.mkdir()
        try:
            prepare(self.task, dest)
        except WorkspaceError as exc:
            raise JobAborted("missing_image_or_workdir", str(exc)) from None
        return dest

    def _resolve_environment(self) -> None:
        from slimecli.sandbox.factory import grader_factory
        from slimecli.swe.env.resolve import EnvUnavailable, describe, unevaluatable_reason

        assert self.environment is not None
        try:
            self.env = self.environment(self.task)
        except EnvUnavailable as exc:
            raise JobAborted(unevaluatable_reason(exc), describe(exc)) from None
        self.metadata["environment"] = {"kind": self.env.kind, "key": self.env.key, "why": self.env.why}
        if self.grade_sandbox is None:
            from slimecli.config.groups.sandbox import SandboxConfig

            self.grade_sandbox = grader_factory(self.sandbox_settings or SandboxConfig(),
                                                path_dirs=self.env.path_dirs, ro_paths=self.env.ro_paths,
                                                image=self.env.image)

    def sandbox_paths(self) -> tuple[list[str], list[str]]:
        if self.env is None:
            return [], []
        return list(self.env.ro_paths), list(self.env.path_dirs)

    def sandbox_image(self) -> str | None:
        return self.env.image if self.env is not None else None

    def prompt(self, sandbox: Sandbox) -> str:
        return SWE_PROMPT.format(workdir=sandbox.workdir, problem_file=PROBLEM_FILE,
                                 problem=self.task.problem_statement.strip())

    async def setup(self, sandbox: Sandbox) -> None:
        sandbox.write_file(PROBLEM_FILE, self.task.problem_statement)

    async def score(self, sandbox: Sandbox) -> dict[str, Any]:
        from slimecli.swe.grade import Unevaluatable, capture_diff, grade

        try:
            diff = await capture_diff(sandbox)
        except Unevaluatable as exc:
            raise JobAborted(f"unevaluatable:{exc.reason}", str(exc)) from None
        self.metadata["diff"] = diff
        if self.grade_sandbox is None:
            from slimecli.sandbox.factory import grader_factory

            self.grade_sandbox = grader_factory(self.sandbox_settings) if self.sandbox_settings else None
        try:
            kwargs: dict[str, Any] = {} if self.grade_sandbox is None else {"sandbox_factory": self.grade_sandbox}
            report = await grade(self.task, diff, budget_s=self.eval_budget_s, partial=self.partial,
                                 limiter=self.limiter, **kwargs)
        except Unevaluatable as exc:
            raise JobAborted(f"unevaluatable:{exc.reason}", str(exc)) from None
        reward = report.as_dict()
        self.metadata["grade"] = {**reward, "apply_method": report.apply_method, "tests": report.tests,
                                  "elapsed_s": round(report.elapsed_s, 3)}
        return reward

    def cleanup(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
