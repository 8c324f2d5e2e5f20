"""One environment probed the way `slimecli env check` shows it: loaded, reset on its first task, stepped once with
an empty reply and closed, each stage timed; what each gave is shown line by line, and StageFailed names the stage
that failed (what was opened is closed first)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from slimecli.env.render import message_line, shorten, tool_lines, tool_names

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig
    from slimecli.env.protocol import Environment, Observation, StepResult
    from slimecli.env.sources import SourceSpec

T = TypeVar("T")


class StageFailed(Exception):
    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"{stage} failed: {detail}")
        self.stage, self.detail = stage, detail


async def _stage(stage: str, call: Awaitable[T], timeout_s: float, timings: dict[str, float]) -> T:
    started = time.perf_counter()
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise StageFailed(stage, f"took longer than env.timeout_s={timeout_s:g}") from None
    except Exception as exc:  # noqa: BLE001 - any failure fails the stage, named with its message
        raise StageFailed(stage, f"{type(exc).__name__}: {exc}") from None
    finally:
        timings[stage] = time.perf_counter() - started


def _timings(timings: dict[str, float]) -> str:
    return ", ".join(f"{stage} {seconds * 1000:.1f}ms" if seconds < 1 else f"{stage} {seconds:.2f}s"
                     for stage, seconds in timings.items())


async def probe_source(cfg: SlimeConfig, spec: SourceSpec, limit: int | None, show: Callable[[str], None]) -> None:
    """Load, reset on the first task (the environment's own, else task.path's rows), one step with an empty
    action, close; `show` each line of what each gave (`limit`: characters of a message, None for all), then the
    timings. StageFailed names the stage that failed."""
    from slimecli.env.episode import Dropped, check_observation, check_step
    from slimecli.env.protocol import Action
    from slimecli.env.sources import load_provider, read_rows

    timings: dict[str, float] = {}
    timeout = cfg.env.timeout_s
    started = time.perf_counter()
    try:
        provider = load_provider(spec, cfg.env)
    except Exception as exc:  # noqa: BLE001 - any failure fails the stage, named with its message
        raise StageFailed("load", f"{type(exc).__name__}: {exc}") from None
    finally:
        timings["load"] = time.perf_counter() - started
    label = f" (source {spec.label})" if cfg.env.mix else ""
    show(f"environment: {provider.describe()}{label}")
    env: Environment | None = None
    failure: StageFailed | None = None
    try:
        try:
            own = provider.tasks(cfg.env.split)
            rows = list(own) if own else read_rows(cfg.task)
        except Exception as exc:  # noqa: BLE001 - any failure fails the stage, named with its message
            raise StageFailed("tasks", f"{type(exc).__name__}: {exc}") from None
        where = f"its own, split {cfg.env.split}" if own else f"rows of task.path={cfg.task.path}"
        show(f"tasks: {len(rows)} ({where}); the first: {shorten(rows[0], limit)}")
        try:
            env = provider.episode()
        except Exception as exc:  # noqa: BLE001 - any failure fails the stage, named with its message
            raise StageFailed("episode", f"{type(exc).__name__}: {exc}") from None
        obs: Observation = await _stage("reset", env.reset(rows[0]), timeout, timings)
        try:
            check_observation(obs, "reset")
        except Dropped as exc:
            raise StageFailed("reset", exc.detail) from None
        show(f"reset: {len(obs.messages)} message(s)")
        for message in obs.messages:
            show(f"  {message_line(message, limit)}")
        show(f"tools: {tool_names(obs.tools)}")
        for line in tool_lines(obs.tools, limit):
            show(f"  {line}")
        result: StepResult = await _stage("step", env.step(Action(text="", content="")), timeout, timings)
        try:
            check_step(result)
        except Dropped as exc:
            raise StageFailed("step", exc.detail) from None
        show(f"step (an empty reply): reward {result.reward:g}, done {result.done}, info {shorten(result.info, limit)}")
        for message in result.observation.messages:
            show(f"  {message_line(message, limit)}")
        if result.observation.tools is not None:
            show(f"  tools now: {tool_names(result.observation.tools)}")
    except StageFailed as exc:
        failure = exc
    # the episode and the environment are closed whatever failed; the first failure is the one reported
    for stage, call in (("close", env.close() if env is not None else None), ("aclose", provider.aclose())):
        if call is None:
            continue
        try:
            await _stage(stage, call, timeout, timings)
        except StageFailed as exc:
            failure = failure or exc
    show(f"timings: {_timings(timings)}")
    if failure is not None:
        raise failure
