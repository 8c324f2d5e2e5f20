"""Harnesses: the agent-CLI lifecycle in a sandbox (locate, write its config, launch, wait with a budget)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from slimecli.agent.harness.install import locate, tools_dir

if TYPE_CHECKING:
    from slimecli.sandbox.base import Sandbox

PROVIDER = "slimecli"


class CliMissing(Exception):
    """The agent CLI is neither configured, installed nor on PATH."""


@dataclass
class HarnessResult:
    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    elapsed_s: float
    argv: list[str] = field(default_factory=list)


class Harness:
    """Base: subclasses say which CLI, which environment and config files, and which command line."""

    agent = "base"
    poll_interval_s = 0.2
    # A lower bound on the characters of the CLI's first request (system prompt, tool schemas), measured on the
    # pinned version; pre-flight refuses a context window that cannot hold it.
    prompt_chars_min = 0
    prompt_chars_min_no_tools = 0  # the same when agent.tools leaves out every built-in tool
    # The built-in tools agent.tools may name (the pinned version's); empty: the CLI takes no tool list.
    builtin_tools: tuple[str, ...] = ()

    @staticmethod
    def shell_call(command: str) -> dict[str, object]:
        """The CLI's shell tool running `command`, as a {"name", "arguments"} choice (agent.constrain=choices)."""
        raise NotImplementedError

    def __init__(self, binary: str | None = None, tools_dir: str | None = None, model_name: str = "slimecli",
                 context_len: int | None = None, tools: tuple[str, ...] | None = None) -> None:
        self.binary = binary
        self.tools = tools
        self.tools_dir = tools_dir
        self.model_name = model_name
        self.context_len = context_len

    def locate(self) -> str:
        found = locate(self.agent, self.binary, self.tools_dir)
        if found is None:
            hint = f"agent.binary={self.binary!r} is not executable" if self.binary else (
                f"run `slimecli agent install {self.agent}`")
            raise CliMissing(f"{self.agent} CLI not found: {hint}")
        return found

    def sandbox_paths(self) -> tuple[list[str], list[str]]:
        """(read-only paths, PATH directories) the CLI needs inside a sandbox: its tools dir, the binary
        (the file, not its directory, which may hold the workspace), node (npm launchers are node scripts)."""
        ro = [str(tools_dir(self.tools_dir))]
        path_dirs: list[str] = []
        try:
            ro.append(str(Path(self.locate()).resolve()))
        except CliMissing:
            pass  # run() reports it
        node = shutil.which("node")
        if node:
            real = Path(node).resolve()
            ro.append(str(real.parent.parent))  # node's prefix: its bin and lib/node_modules
            path_dirs.append(os.path.dirname(node))
        return [p for p in ro if os.path.exists(p)], path_dirs

    def configure(self, sandbox: Sandbox, base_url: str, session_id: str) -> dict[str, str]:
        """Write the CLI's config inside the sandbox home; return the environment it needs."""
        raise NotImplementedError

    def command(self, binary: str, prompt: str, sandbox: Sandbox) -> list[str]:
        raise NotImplementedError

    async def run(self, sandbox: Sandbox, prompt: str, base_url: str, session_id: str, budget_s: float
                  ) -> HarnessResult:
        """Launch in the background and poll its exit status until it exits or the budget is spent."""
        binary = self.locate()
        env = self.configure(sandbox, base_url, session_id)
        argv = self.command(binary, prompt, sandbox)
        start = time.monotonic()
        sandbox.start(self.agent, argv, env)
        exit_code = None
        try:
            while time.monotonic() - start < budget_s:
                exit_code = sandbox.poll(self.agent)
                if exit_code is not None:
                    break
                await asyncio.sleep(self.poll_interval_s)
        finally:
            await asyncio.to_thread(sandbox.kill, self.agent)  # on timeout, cancellation, and leftover children
        stdout, stderr = sandbox.output(self.agent)
        return HarnessResult(exit_code, exit_code is None, stdout, stderr, time.monotonic() - start, argv)


class ClaudeCodeHarness(Harness):
    """`claude -p` against the Anthropic adapter: base URL, session id as API key, no telemetry."""

    agent = "claude_code"
    prompt_chars_min = 40_000  # 2.1.x: about 50k characters with the default tools (31k of them tool schemas)
    prompt_chars_min_no_tools = 12_000  # the same without tool schemas (agent.tools=[]): about 14.5k characters
    # The pinned version's built-in tool names (its sdk-tools.d.ts), for agent.tools.
    builtin_tools = ("Agent", "AskUserQuestion", "Bash", "Edit", "EnterPlanMode", "ExitPlanMode", "Glob", "Grep",
                     "ListAgents", "Monitor", "NotebookEdit", "Read", "ReportFindings", "ScheduleWakeup", "Skill",
                     "TaskStop", "TodoWrite", "ToolSearch", "WebFetch", "WebSearch", "Workflow", "Write")

    @staticmethod
    def shell_call(command: str) -> dict[str, object]:
        return {"name": "Bash", "arguments": {"command": command, "description": "Apply the change"}}

    def configure(self, sandbox: Sandbox, base_url: str, session_id: str) -> dict[str, str]:
        config_dir = sandbox.home / ".claude"
        # Auto-memory off: a fresh sandbox has nothing to remember, and its section names the sandbox's own
        # home ~4k characters into the system prompt, which would end the prefix every run shares there.
        settings = {"permissions": {"defaultMode": "bypassPermissions"}, "includeCoAuthoredBy": False,
                    "autoMemoryEnabled": False}
        sandbox.write_file(config_dir / "settings.json", json.dumps(settings, indent=2))
        return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": session_id,
                "CLAUDE_CONFIG_DIR": str(config_dir), "DISABLE_TELEMETRY": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1", "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1"}

    def command(self, binary: str, prompt: str, sandbox: Sandbox) -> list[str]:
        # The sandbox is the permission boundary; IS_SANDBOX=1 lets this flag run as root there.
        tools = [] if self.tools is None else ["--tools", ",".join(self.tools)]
        return [binary, "-p", prompt, "--dangerously-skip-permissions", *tools]


class CodexHarness(Harness):
    """`codex exec` with a private CODEX_HOME whose config.toml points a wire_api="responses" provider here."""

    agent = "codex"
    prompt_chars_min = 22_000  # about 28k characters with the tools

    @staticmethod
    def shell_call(command: str) -> dict[str, object]:
        return {"name": "exec_command", "arguments": {"cmd": command}}

    def configure(self, sandbox: Sandbox, base_url: str, session_id: str) -> dict[str, str]:
        codex_home = sandbox.home / ".codex"
        sandbox.write_file(codex_home / "config.toml", codex_config_toml(base_url, self.model_name, self.context_len))
        return {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": session_id, "RUST_LOG": "error"}

    def command(self, binary: str, prompt: str, sandbox: Sandbox) -> list[str]:
        return [binary, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "-C", str(sandbox.workdir), prompt]


def codex_provider(base_url: str) -> str:
    """The provider table as one TOML inline table (also usable in a `-c model_providers.slimecli=...` flag)."""
    return (f'{{name="{PROVIDER}",base_url="{base_url.rstrip("/")}/v1",wire_api="responses",'
            f'env_key="OPENAI_API_KEY",request_max_retries=2,stream_max_retries=2}}')


# What Codex does at start-up beyond the task: a release check on GitHub, analytics sent home, the curated plugins
# synced from GitHub. Its exit waits for them, and in a sandbox without a network each run lost about 4 s to DNS
# timeouts (5.6 s -> 1.6 s for a one-turn run). A rollout wants none of them.
CODEX_QUIET = ("check_for_update_on_startup = false\n"
               "[analytics]\nenabled = false\n"
               "[features]\nplugins = false\n")


def codex_config_toml(base_url: str, model_name: str, context_len: int | None = None) -> str:
    window = f"model_context_window = {context_len}\n" if context_len else ""  # Codex compacts before the limit
    return (f'model = "{model_name}"\nmodel_provider = "{PROVIDER}"\n{window}'
            f'model_providers.{PROVIDER} = {codex_provider(base_url)}\n{CODEX_QUIET}')


def codex_flags(base_url: str, model_name: str) -> list[str]:
    return ["-c", f"model_provider={PROVIDER}", "-c", f"model_providers.{PROVIDER}={codex_provider(base_url)}",
            "-m", model_name]
