"""One agent task end to end: a session, the CLI in a local sandbox under a budget, captured samples.

Every way out (CLI missing, timeout, nothing captured, any exception, cancellation) drops the session;
failures yield the aborted sample so a rollout group keeps its shape.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from slimecli.agent.harness import CliMissing, HarnessResult
from slimecli.agent.sandbox import LocalSandbox
from slimecli.agent.service import AgentService
from slimecli.rollout.sample import Sample

log = logging.getLogger(__name__)
TAIL = 4000


async def run_task(service: AgentService, prompt: str, workdir: str | None = None, budget_s: float | None = None,
                   base_sample: Sample | None = None, reward: Any = 0.0) -> list[Sample]:
    agent = service.cfg.agent
    budget = agent.time_budget_s if budget_s is None else budget_s
    sid = f"slimecli-{uuid.uuid4().hex}"
    base = base_sample if base_sample is not None else Sample(prompt=prompt)
    info: dict[str, Any] = {"agent": service.name, "session": sid}
    harness = service.harness_cls(binary=agent.binary, tools_dir=agent.tools_dir,
                                  model_name=service.adapter.settings.model_name,
                                  context_len=service.renderer.context_len)
    sandbox: LocalSandbox | None = None

    def aborted(reason: str) -> list[Sample]:
        log.warning("agent run %s aborted: %s", sid, reason)
        return [Sample.aborted(reason, prompt=base.prompt, label=base.label, group_index=base.group_index,
                               index=base.index, rollout_id=base.rollout_id, session_id=sid,
                               metadata={**base.metadata, **info})]

    try:
        if workdir is not None and not Path(workdir).is_dir():
            return aborted("missing_image_or_workdir")
        sandbox = LocalSandbox(workdir)
        info["workdir"] = str(sandbox.workdir)
        result = await harness.run(sandbox, prompt, service.base_url, sid, budget)
        info.update(_describe(result))
        if result.timed_out:
            return aborted("wall_clock_timeout")
        samples = await service.manager.finish_session(sid, base, reward)
        if not samples:
            return aborted("adapter_session_empty")
        for sample in samples:
            sample.metadata.update(info)
        return samples
    except CliMissing as exc:
        info["error"] = str(exc)
        return aborted("cli_missing")
    except Exception as exc:  # noqa: BLE001 - any failure of one run becomes its aborted sample
        log.exception("agent run %s failed", sid)
        info["error"] = repr(exc)[:TAIL]
        return aborted(f"exception:{type(exc).__name__}")
    finally:
        service.manager.drop_session(sid)
        if sandbox is not None:
            sandbox.close()


def _describe(result: HarnessResult) -> dict[str, Any]:
    return {"exit_code": result.exit_code, "timed_out": result.timed_out, "elapsed_s": round(result.elapsed_s, 3),
            "cli_stdout": result.stdout[-TAIL:], "cli_stderr": result.stderr[-TAIL:]}
