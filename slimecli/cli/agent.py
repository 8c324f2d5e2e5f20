"""`slimecli agent serve|run|install`: agent back-ends (adapter + engine), one agent task, the pinned CLIs."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from slimecli.cli.common import (
    OVERRIDES,
    RecipeDirOption,
    command_group,
    echo_err,
    fail,
    load_config_or_exit,
    say_sandbox,
    split_overrides,
)

if TYPE_CHECKING:
    from slimecli.config.errors import ConfigError
    from slimecli.config.schema import SlimeConfig

EPILOG = """[bold]Examples[/]

  slimecli agent install claude_code                       # npm package into ~/.cache/slimecli/tools

  slimecli agent serve agent=claude_code model.path=DIR    # engine + Anthropic adapter on a free port (printed)

  slimecli agent serve agent=codex agent.engine_url=http://127.0.0.1:30000   # adapter over a running engine

  slimecli agent run agent=codex task.prompt="add a README" task.workdir=./repo agent.output=samples.jsonl

  slimecli agent run agent=codex task=swe task.instance=tiny-calc-003          # graded by the task's tests

  SWE_AGENT=claude_code slimecli agent run task=swe task.path=builtin:swe_tiny task.instance=tiny-wrap-002
"""


def _config(ctx: typer.Context, recipe_dir: list[str],
            preflight: Callable[[SlimeConfig], list[ConfigError]]) -> SlimeConfig:
    """The composed config (its rules) and the command's pre-flight (slimecli.launch.preflight): exit 2 on any."""
    from slimecli.cli.serve import served_config
    from slimecli.model.loading import set_trust_remote_code

    overrides = split_overrides(ctx.args)
    cfg = served_config(load_config_or_exit(overrides, recipe_dir, uses_agent=True), overrides, preflight)
    set_trust_remote_code(cfg.model.trust_remote_code)  # the adapter's tokenizer loads in this process
    return cfg


def _service(cfg, port: int | None = None):
    from slimecli.agent.api.service import AgentService
    from slimecli.launch.forked import fork_from_here

    try:  # its engine forked from this process: its tokenizer imports torch too (one import, launch/template.py)
        return AgentService(cfg, port=port, spawn=fork_from_here)
    except ValueError as exc:
        fail(str(exc))


def _job(cfg):
    """What `agent run` works on: one SWE task (graded), or a plain prompt."""
    from slimecli.agent.harness.jobs import AgentJob, SweJob
    from slimecli.swe.env.resolve import resolve

    if cfg.task.name != "swe":
        return AgentJob(cfg.task.prompt, cfg.task.workdir)
    from slimecli.swe.task import load_for

    task = load_for(cfg.task).get(cfg.task.instance)
    assert task is not None  # the task rules checked it
    return SweJob(task, environment=lambda t: resolve(t, cfg.task, cfg.sandbox), sandbox_settings=cfg.sandbox,
                  eval_budget_s=cfg.agent.eval_budget_s, partial=cfg.reward.partial)


def _usage(service) -> str:
    from slimecli.agent.harness.clis import codex_flags

    url = service.base_url
    if service.name == "codex":
        flags = shlex.join(codex_flags(url, service.adapter.settings.model_name))
        return f"OPENAI_API_KEY=<session-id> codex exec {flags} \"<task>\""
    if service.name == "claude_code":
        return (f"ANTHROPIC_BASE_URL={url}\nANTHROPIC_BASE_URL={url} ANTHROPIC_API_KEY=<session-id> "
                f"DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 claude -p \"<task>\"")
    return f"base URL: {url}"


def _show_turn() -> Callable[[str, Any], None]:
    """Each model turn as it ends: its number, its tokens, the tools it called (the text goes to the transcript)."""
    count = [0]

    def show(_sid: str, turn: Any) -> None:
        count[0] += 1
        tools = f", called {', '.join(turn.tool_calls)}" if turn.tool_calls else ""
        echo_err(f"  turn {count[0]}: {len(turn.output_ids)} tokens in {turn.engine_s:.1f}s{tools}")

    return show


def register(app: typer.Typer) -> None:
    agent_app = command_group(app, "agent", "Coding-agent back-ends: LLM API adapters over the rollout engine, CLI "
                                            "harnesses.")

    @agent_app.command("serve", context_settings=OVERRIDES, epilog=EPILOG)
    def serve(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
        """Start the engine (or use agent.engine_url) and the agent's adapter; print how to point the CLI at it."""
        from slimecli.cli.serve import run_until_signal
        from slimecli.launch.preflight import agent_serve_errors

        cfg = _config(ctx, recipe_dir, agent_serve_errors)
        service = _service(cfg)

        async def main() -> None:
            import asyncio

            await service.start()
            typer.echo(f"agent {service.name}: adapter on {service.base_url} (GET /healthz), "
                       f"engine {service.engine.base_url}")
            typer.echo(_usage(service))
            echo_err("note: the CLI you point at this adapter runs its commands wherever you start it; no slimecli "
                     "sandbox applies to them (`slimecli agent run` runs the CLI in one)")
            try:
                await asyncio.Event().wait()
            finally:
                await service.stop()

        try:
            run_until_signal(main())
        except KeyboardInterrupt:
            pass
        except (RuntimeError, OSError) as exc:
            fail(f"agent serve: {exc}", code=1)

    @agent_app.command("run", context_settings=OVERRIDES, epilog=EPILOG)
    def run(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
        """Run one task in a sandbox against the adapter: task.prompt (optionally in task.workdir), or a SWE task
        (task=swe task.instance=ID) whose diff is graded by its tests; write the captured samples as JSONL."""
        from slimecli.cli.serve import run_until_signal
        from slimecli.launch.preflight import agent_run_errors

        cfg = _config(ctx, recipe_dir, agent_run_errors)
        say_sandbox(cfg)  # sandbox=local: what it leaves open (again at the end); auto: the kind it picked
        out = Path(cfg.agent.output or Path(cfg.run.root) / f"agent-{time.strftime('%Y%m%d-%H%M%S')}"
                   / "samples.jsonl").expanduser()
        service = _service(cfg, port=0)

        async def main():
            from slimecli.agent.harness.task import run_task

            echo_err(f"agent {service.name}: starting the engine and the adapter")
            await service.start()
            service.manager.on_turn = _show_turn()
            try:
                return await run_task(service, _job(cfg), on_event=lambda text: echo_err(f"agent {service.name}: "
                                                                                          f"{text}"))
            finally:
                await service.stop()

        try:
            samples = run_until_signal(main())
        except KeyboardInterrupt:
            fail("agent run: interrupted", code=130)
        except (RuntimeError, OSError) as exc:
            fail(f"agent run: {exc}", code=1)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as f:
            for sample in samples:
                f.write(json.dumps(sample.to_dict(), default=str) + "\n")
        from slimecli.agent.trajectory import transcript

        meta = samples[0].metadata
        statuses = ", ".join(s.status.value for s in samples)
        graded = f"; reward {json.dumps(samples[0].reward)}" if cfg.task.name == "swe" and not samples[0].remove_sample \
            else ""
        echo_err(f"agent {service.name}: CLI exit {meta.get('exit_code')}; {len(samples)} sample(s) [{statuses}]"
                 f"{graded} -> {out}")
        typer.echo(f"transcript: {transcript.write(out.parent, samples)}")
        if cfg.sandbox.name == "local":
            say_sandbox(cfg)
        if samples[0].remove_sample:
            fail(f"agent run aborted: {meta.get('abort_reason')} {meta.get('error', '')}".rstrip(), code=1)

    @agent_app.command("install", epilog=EPILOG)
    def install(name: str = typer.Argument(..., help="claude_code or codex"),
                tools_dir: str = typer.Option(None, "--dir", help="Tools directory (default agent.tools_dir, "
                                              "$SLIMECLI_TOOLS_DIR or ~/.cache/slimecli/tools)."),
                print_only: bool = typer.Option(False, "--print", help="Print the npm command, do not run it.")) -> None:
        """Install the pinned npm package of an agent CLI into slimecli's tools directory."""
        from slimecli.agent.harness import install as inst

        try:
            cmd = inst.install_command(name, tools_dir)
        except ValueError as exc:
            fail(str(exc))
        if print_only:
            typer.echo(shlex.join(cmd))
            return
        echo_err(shlex.join(cmd))
        try:
            binary = inst.install(name, tools_dir)
        except RuntimeError as exc:
            fail(str(exc), code=1)
        typer.echo(str(binary))
