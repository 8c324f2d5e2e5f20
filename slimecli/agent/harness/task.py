"""One agent task end to end: a session, the CLI in a sandbox (sandbox=...) under a budget, captured samples.

Every way out (CLI missing, timeout, nothing captured, any exception, cancellation) drops the session;
failures yield the aborted sample so a rollout group keeps its shape.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slimecli.agent.api.service import AgentService
from slimecli.agent.harness.clis import CliMissing, HarnessResult
from slimecli.agent.harness.jobs import AgentJob, JobAborted
from slimecli.rollout.sample import Sample
from slimecli.sandbox.base import Sandbox

log = logging.getLogger(__name__)
TAIL = 4000
# (workdir, allowed ports, read-only paths, PATH dirs) -> a sandbox; for an image task also image=IMAGE
SandboxFactory = Callable[..., Sandbox]


def default_factory(service: AgentService) -> SandboxFactory:
    from slimecli.sandbox.factory import make_sandbox

    def make(workdir: Path | None, ports: Sequence[int], ro_paths: Sequence[str], path_dirs: Sequence[str],
             image: str | None = None) -> Sandbox:
        return make_sandbox(service.cfg.sandbox, workdir, allow_ports=ports, ro_paths=ro_paths, path_dirs=path_dirs,
                            image=image)

    return make


async def run_task(service: AgentService, job: AgentJob, *, budget_s: float | None = None,
                   base_sample: Sample | None = None, sandbox_factory: SandboxFactory | None = None,
                   on_event: Callable[[str], None] | None = None) -> list[Sample]:
    """`job`: what to work on and how the result is scored (slimecli.agent.harness.jobs). ``on_event``: told each
    phase as it starts (sandbox ready, agent started, grading), for a user watching one run."""
    say = on_event or (lambda _text: None)
    agent = service.cfg.agent
    budget = agent.time_budget_s if budget_s is None else budget_s
    sid = f"slimecli-{uuid.uuid4().hex}"
    base = base_sample if base_sample is not None else Sample(prompt=job.text)
    info: dict[str, Any] = {"agent": service.name, "session": sid}
    harness = service.harness_cls(binary=agent.binary, tools_dir=agent.tools_dir,
                                  model_name=service.adapter.settings.model_name,
                                  context_len=service.renderer.context_len, tools=agent.tools)
    factory = sandbox_factory or default_factory(service)
    sandbox: Sandbox | None = None

    def aborted(reason: str) -> list[Sample]:
        log.warning("agent run %s aborted: %s", sid, reason)
        return [Sample.aborted(reason, prompt=base.prompt, label=base.label, group_index=base.group_index,
                               index=base.index, rollout_id=base.rollout_id, session_id=sid,
                               metadata={**base.metadata, **job.metadata, **info})]

    try:
        ro_paths, path_dirs = harness.sandbox_paths()  # the CLI reaches its adapter's port and nothing else
        started = time.perf_counter()
        async with service.boots:  # a cap on workspaces and sandboxes being made at once (container starts)
            ws = await asyncio.to_thread(job.workspace)
            env_ro, env_dirs = job.sandbox_paths()  # the task's environment: the same one its grader uses
            image = job.sandbox_image()  # an image task: its container (a factory that takes `image=`)
            make = factory if image is None else functools.partial(factory, image=image)
            sandbox = await asyncio.to_thread(make, ws, [service.port], [*ro_paths, *env_ro], [*env_dirs, *path_dirs])
            info.update(sandbox=sandbox.kind, workdir=str(sandbox.workdir))
            await job.setup(sandbox)
        info["sandbox_s"] = round(time.perf_counter() - started, 4)  # boot wait included
        say(f"sandbox {sandbox.kind} ready in {info['sandbox_s']:.1f}s ({sandbox.workdir})")
        if job.choices is not None:  # agent.constrain=choices: the task's listed alternatives
            service.adapter.set_choices(sid, [_as_call(c, harness) for c in job.choices])
        say(f"{service.name} started (budget {budget:.0f}s)")
        result = await harness.run(sandbox, job.prompt(sandbox), service.base_url, sid, budget)
        say(f"{service.name} exited ({'timed out' if result.timed_out else f'exit {result.exit_code}'}, "
            f"{result.elapsed_s:.1f}s)")
        info.update(_describe(result), engine=service.engine.assigned(sid))
        if result.timed_out:
            if agent.on_timeout == "zero":  # the model ran out of time: its turns train with reward 0
                samples = await service.manager.finish_session(sid, base, 0.0)
                for sample in samples:
                    sample.metadata.update({**job.metadata, **info, "abort_reason": "wall_clock_timeout"})
                if samples:
                    return samples
            return aborted("wall_clock_timeout")
        started = time.perf_counter()
        if job.graded:
            say("grading")
        try:
            score = await job.score(sandbox)
        finally:
            info["grade_s"] = round(time.perf_counter() - started, 4)
        samples = await service.manager.finish_session(sid, base, score)
        if not samples:
            return aborted("adapter_session_empty")
        for sample in samples:
            sample.metadata.update({**job.metadata, **info})
        return samples
    except JobAborted as exc:
        info["error"] = exc.detail[:TAIL]
        return aborted(exc.reason)
    except CliMissing as exc:
        info["error"] = str(exc)
        return aborted("cli_missing")
    except Exception as exc:  # any failure of one run becomes its aborted sample
        log.exception("agent run %s failed", sid)
        info["error"] = repr(exc)[:TAIL]
        return aborted(f"exception:{type(exc).__name__}")
    finally:
        service.manager.drop_session(sid)
        service.engine.release(sid)
        if sandbox is not None:
            sandbox.close()
        job.cleanup()


def _as_call(choice: Any, harness: Any) -> Any:
    """{"shell": COMMAND} is that command through the CLI's own shell tool; other choices pass as they are."""
    if isinstance(choice, dict) and set(choice) == {"shell"} and isinstance(choice["shell"], str):
        return harness.shell_call(choice["shell"])
    return choice


def _describe(result: HarnessResult) -> dict[str, Any]:
    return {"exit_code": result.exit_code, "timed_out": result.timed_out, "elapsed_s": round(result.elapsed_s, 3),
            "cli_stdout": result.stdout[-TAIL:], "cli_stderr": result.stderr[-TAIL:]}
