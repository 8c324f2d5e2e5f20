"""`slimecli env list|check|run`: RL environments (env=KIND env.id=ID, slimecli/env/): what is installed, one
environment reset and stepped once, a few episodes played by a model with their transcripts.

Not a SWE task's environment (task.environment, `slimecli tasks env`)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

from slimecli.cli.common import (
    OVERRIDES,
    RecipeDirOption,
    command_group,
    echo_err,
    fail,
    load_config_or_exit,
    split_overrides,
)

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig
    from slimecli.env.protocol import Action, Environment, Observation, StepResult
    from slimecli.env.provider import EnvProvider
    from slimecli.env.sources import SourceSpec

T = TypeVar("T")

HELP = ("RL environments (env=KIND env.id=ID, the episodes a policy is trained in): list what is installed, check "
        "one, run a few episodes. Not a SWE task's environment (task.environment: see `slimecli tasks env`).")

EPILOG = """[bold]Examples[/]

  slimecli env list                                          # every kind: its environments and where from

  slimecli env check env=native env.id=lookup                 # load, reset, one step, close; timings

  slimecli env check env=reasoning_gym env.id=leg_counting

  slimecli env run env=native env.id=lookup --episodes 4      # the tiny model on the embedded engine

  slimecli env run +recipe=env_lookup model.path=RUN/final --out episodes.jsonl

  slimecli env run env=native env.id=lookup --url http://127.0.0.1:30000   # a served model (/generate)
"""

# the module each adapter's library is imported as, and the distribution that installs it
LIBRARIES: dict[str, tuple[str, str]] = {"verifiers": ("verifiers", "verifiers"),
                                         "openenv": ("openenv", "openenv-core"),
                                         "skyrl_gym": ("skyrl_gym", "skyrl-gym"),
                                         "reasoning_gym": ("reasoning_gym", "reasoning-gym")}
SHORT = 240  # characters of a message or a policy turn shown (--full: all)
ROLLOUT_FAILURES = (RuntimeError, OSError, TimeoutError, ValueError)


# ---- text ------------------------------------------------------------------------------------------------------
def shorten(value: Any, limit: int | None = SHORT) -> str:
    """One line: newlines shown as \\n, cut at `limit` characters with the count of the rest."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}… (+{len(text) - limit} chars)"
    return text


def message_line(message: Mapping[str, Any], limit: int | None = SHORT) -> str:
    role = str(message.get("role", "?"))
    if role == "tool" and message.get("name"):
        role = f"tool {message['name']}"
    return f"{role}: {shorten(message.get('content', ''), limit)}"


def tool_lines(tools: list[dict[str, Any]] | None, limit: int | None = SHORT) -> list[str]:
    """Each tool: its name and description, then its parameters' schema."""
    out = []
    for schema in tools or []:
        fn = schema.get("function", schema) if isinstance(schema, Mapping) else {}
        fn = fn if isinstance(fn, Mapping) else {}
        desc = f": {shorten(fn['description'], limit)}" if fn.get("description") else ""
        out.append(f"{fn.get('name', '?')}{desc}")
        out.append(f"  parameters {shorten(fn.get('parameters', {}), limit)}")
    return out


def names_of(tools: list[dict[str, Any]] | None) -> list[str]:
    names = []
    for schema in tools or []:
        fn = schema.get("function", schema) if isinstance(schema, Mapping) else {}
        names.append(str(fn.get("name", "?")) if isinstance(fn, Mapping) else "?")
    return names


def tool_names(tools: list[dict[str, Any]] | None) -> str:
    return ", ".join(names_of(tools)) or "none"


# ---- env list --------------------------------------------------------------------------------------------------
def list_kind(kind: str) -> tuple[str, list[tuple[str, str]] | None]:
    """(the kind's heading, its rows): what available() lists, or None with the heading saying why nothing can be
    listed."""
    import importlib.metadata
    import importlib.util

    from slimecli.env.adapters import adapter, install_hint

    if kind == "native":
        heading = "native (slimecli's own protocol: built-ins, slimecli.environments entry points, registrations)"
    else:
        module, dist = LIBRARIES[kind]
        if importlib.util.find_spec(module) is None:
            return f"{kind}: not installed ({install_hint(kind)})", None
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        heading = f"{kind} ({dist} {version})"
    try:
        rows = adapter(kind).available()
    except Exception as exc:  # a library that is there but cannot list its environments
        return f"{heading}: cannot list its environments: {type(exc).__name__}: {shorten(str(exc))}", None
    return heading, [(str(name), str(origin)) for name, origin in rows]


# ---- env check -------------------------------------------------------------------------------------------------
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
    except Exception as exc:
        raise StageFailed(stage, f"{type(exc).__name__}: {exc}") from None
    finally:
        timings[stage] = time.perf_counter() - started


def _timings(timings: dict[str, float]) -> str:
    return ", ".join(f"{stage} {seconds * 1000:.1f}ms" if seconds < 1 else f"{stage} {seconds:.2f}s"
                     for stage, seconds in timings.items())


async def check_source(cfg: SlimeConfig, spec: SourceSpec, limit: int | None) -> None:
    """Load, reset on the first task, one step with an empty action, close; print what each gave. StageFailed
    names the stage that failed (what was opened is closed)."""
    from slimecli.env.episode import Dropped, check_observation, check_step
    from slimecli.env.protocol import Action
    from slimecli.env.sources import load_provider, read_rows

    timings: dict[str, float] = {}
    timeout = cfg.env.timeout_s
    started = time.perf_counter()
    try:
        provider = load_provider(spec, cfg.env)
    except Exception as exc:
        raise StageFailed("load", f"{type(exc).__name__}: {exc}") from None
    finally:
        timings["load"] = time.perf_counter() - started
    label = f" (source {spec.label})" if cfg.env.mix else ""
    typer.echo(f"environment: {provider.describe()}{label}")
    env: Environment | None = None
    failure: StageFailed | None = None
    try:
        try:
            own = provider.tasks(cfg.env.split)
            rows = list(own) if own else read_rows(cfg.task)
        except Exception as exc:
            raise StageFailed("tasks", f"{type(exc).__name__}: {exc}") from None
        where = f"its own, split {cfg.env.split}" if own else f"rows of task.path={cfg.task.path}"
        typer.echo(f"tasks: {len(rows)} ({where}); the first: {shorten(rows[0], limit)}")
        try:
            env = provider.episode()
        except Exception as exc:
            raise StageFailed("episode", f"{type(exc).__name__}: {exc}") from None
        obs: Observation = await _stage("reset", env.reset(rows[0]), timeout, timings)
        try:
            check_observation(obs, "reset")
        except Dropped as exc:
            raise StageFailed("reset", exc.detail) from None
        typer.echo(f"reset: {len(obs.messages)} message(s)")
        for message in obs.messages:
            typer.echo(f"  {message_line(message, limit)}")
        typer.echo(f"tools: {tool_names(obs.tools)}")
        for line in tool_lines(obs.tools, limit):
            typer.echo(f"  {line}")
        result: StepResult = await _stage("step", env.step(Action(text="", content="")), timeout, timings)
        try:
            check_step(result)
        except Dropped as exc:
            raise StageFailed("step", exc.detail) from None
        typer.echo(f"step (an empty reply): reward {result.reward:g}, done {result.done}, "
                   f"info {shorten(result.info, limit)}")
        for message in result.observation.messages:
            typer.echo(f"  {message_line(message, limit)}")
        if result.observation.tools is not None:
            typer.echo(f"  tools now: {tool_names(result.observation.tools)}")
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
    typer.echo(f"timings: {_timings(timings)}")
    if failure is not None:
        raise failure


# ---- env run ---------------------------------------------------------------------------------------------------
# what one episode did, in order (set per episode task; the engine and environment wrappers append to it)
_EVENTS: contextvars.ContextVar[list[dict[str, Any]]] = contextvars.ContextVar("slimecli_env_events")


def _event(event: dict[str, Any]) -> None:
    events = _EVENTS.get(None)
    if events is not None:
        events.append(event)


def _observation(obs: Any) -> dict[str, Any]:
    messages = getattr(obs, "messages", None)
    tools = getattr(obs, "tools", None)
    return {"messages": [dict(m) if isinstance(m, Mapping) else repr(m) for m in messages]
            if isinstance(messages, list) else repr(obs),
            "tools": names_of(tools) if isinstance(tools, list) else None}


class RecordingEnv:
    """An episode's environment as it is, each reset and step also recorded as an event."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        obs = await self.env.reset(task)
        _event({"reset": _observation(obs)})
        return obs

    async def step(self, action: Action) -> StepResult:
        result = await self.env.step(action)
        reward, done, info = (getattr(result, k, None) for k in ("reward", "done", "info"))
        _event({"step": {"reward": reward if isinstance(reward, int | float) else repr(reward), "done": done,
                         "info": info, **_observation(getattr(result, "observation", None))},
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in action.tool_calls]})
        return result

    async def close(self) -> None:
        await self.env.close()


class RecordingProvider:
    """A loaded environment whose episodes are recorded (RecordingEnv); everything else is the provider's."""

    def __init__(self, provider: EnvProvider) -> None:
        self.provider = provider

    def episode(self) -> RecordingEnv:
        return RecordingEnv(self.provider.episode())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)


class RecordingEngine:
    """An engine client whose /generate replies are recorded as the policy's turns (decoded)."""

    def __init__(self, client: Any, tokenizer: Any) -> None:
        self.client, self.tokenizer = client, tokenizer

    async def generate(self, **kwargs: Any) -> Any:
        out = await self.client.generate(**kwargs)
        reply = out if isinstance(out, dict) else out[0]
        meta = reply.get("meta_info") or {}
        ids = [int(e[1]) for e in meta.get("output_token_logprobs") or []]
        _event({"policy": self.tokenizer.decode(ids, skip_special_tokens=False), "tokens": len(ids),
                "finish": (meta.get("finish_reason") or {}).get("type", "")})
        return out


def transcript(number: int, total: int, rec: dict[str, Any], sample: Any, events: list[dict[str, Any]],
               limit: int | None) -> list[str]:
    lines = [f"── episode {number}/{total} · {rec['source']} · task {shorten(rec['task'], limit)}"]
    turn = 0
    for event in events:
        if "reset" in event:
            obs = event["reset"]
            for message in obs["messages"] if isinstance(obs["messages"], list) else [obs["messages"]]:
                lines.append(f"  {message_line(message, limit) if isinstance(message, Mapping) else message}")
            if obs["tools"] is not None:
                lines.append(f"  tools: {', '.join(obs['tools'])}")
        elif "policy" in event:
            turn += 1
            finish = f", {event['finish']}" if event["finish"] and event["finish"] != "stop" else ""
            lines.append(f"  turn {turn} policy ({event['tokens']} tokens{finish}): {shorten(event['policy'], limit)}")
        elif "step" in event:
            step = event["step"]
            calls = ", ".join(f"{c['name']}({shorten(c['arguments'], limit)})" for c in event["tool_calls"])
            head = f"  turn {turn} env: reward {step['reward']}" + (" · done" if step["done"] else "") \
                + (f" · called {calls}" if calls else "") + (f" · info {shorten(step['info'], limit)}"
                                                             if step["info"] else "")
            lines.append(head)
            messages = step["messages"] if isinstance(step["messages"], list) else [step["messages"]]
            for message in messages:
                lines.append(f"    {message_line(message, limit) if isinstance(message, Mapping) else message}")
            if step["tools"] is not None and not step["done"]:
                lines.append(f"    tools now: {', '.join(step['tools'])}")
    meta = sample.metadata
    if sample.remove_sample:
        lines.append(f"  result: dropped ({meta.get('drop_reason')}): {shorten(meta.get('drop_detail', ''), limit)}")
    else:
        limit_note = " (turn limit)" if meta.get("turn_limit") else ""
        lines.append(f"  result: reward {float(sample.reward):g} · {meta.get('turns', turn)} turn(s){limit_note} · "
                     f"{sample.response_length} tokens")
    return lines


def summary(samples: list[Any]) -> list[str]:
    kept = [s for s in samples if not s.remove_sample]
    mean_reward = sum(float(s.reward) for s in kept) / len(kept) if kept else 0.0
    mean_turns = sum(int(s.metadata.get("turns", 0)) for s in samples) / len(samples) if samples else 0.0
    reasons: dict[str, int] = {}
    for s in samples:
        if s.remove_sample:
            reason = str(s.metadata.get("drop_reason", "unknown"))
            reasons[reason] = reasons.get(reason, 0) + 1
    hit_limit = sum(1 for s in kept if s.metadata.get("turn_limit"))
    lines = [f"summary: {len(samples)} episode(s) · mean reward {mean_reward:.3f} (over {len(kept)} kept) · "
             f"mean turns {mean_turns:.2f} · turn limit {hit_limit} · dropped {len(samples) - len(kept)}"]
    if reasons:
        lines.append("dropped: " + ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items())))
    return lines


def jsonl_row(number: int, rec: dict[str, Any], sample: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    meta = sample.metadata
    return {"episode": number, "source": rec["source"], "position": rec.get("position"), "task": rec["task"],
            "status": str(sample.status), "reward": float(sample.reward), "turns": meta.get("turns"),
            "dropped": bool(sample.remove_sample), "drop_reason": meta.get("drop_reason"),
            "drop_detail": meta.get("drop_detail"), "events": events, "response": sample.response,
            "metadata": meta}


async def wait_engine(client: Any, proc: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and (reason := proc.failed()):
            raise RuntimeError(reason)
        if await client.health():
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"rollout engine at {client.base_url} not ready after {timeout_s:.0f}s")


def _no_environment(command: str) -> NoReturn:
    fail(f"env {command}: no environment given: env=KIND env.id=ID (slimecli env list shows what is installed)")


def register(app: typer.Typer) -> None:
    env_app = command_group(app, "env", HELP)

    @env_app.command("list", epilog=EPILOG)
    def list_(kind: str = typer.Argument(None, help="Only this kind (native, verifiers, openenv, skyrl_gym, "
                                                     "reasoning_gym).")) -> None:
        """What each kind (env=KIND) can load, and where it comes from.

        Kinds whose library is missing say which extra installs it."""
        from slimecli.env.adapters import ADAPTERS

        if kind is not None and kind not in ADAPTERS:
            from slimecli.config.errors import allowed_hint

            fail(f"env list: unknown kind {kind!r}; {allowed_hint(kind, list(ADAPTERS))}")
        for i, name in enumerate([kind] if kind else list(ADAPTERS)):
            heading, rows = list_kind(name)
            if i:
                typer.echo("")
            typer.echo(heading)
            if rows is None:
                continue
            width = max((len(env_id) for env_id, _ in rows), default=0)
            for env_id, origin in rows:
                typer.echo(f"  {env_id.ljust(width)}  {origin}")
            if not rows:
                typer.echo("  (none installed)")

    @env_app.command("check", context_settings=OVERRIDES, epilog=EPILOG)
    def check(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption,
              full: bool = typer.Option(False, "--full", help="Show messages and schemas whole.")) -> None:
        """Load an environment, reset and step one episode, close it: what each gave, and its time.

        The episode is reset on the first task (the environment's own tasks, else task.path's rows); its
        observation and tools are shown, then one step with an empty reply (its reward, done and info).

        Exits 1 when the environment fails (the stage is named), 2 on a config error."""
        from slimecli.env.sources import source_specs

        cfg = load_config_or_exit(split_overrides(ctx.args), recipe_dir)
        specs = source_specs(cfg.env)
        if not specs:
            _no_environment("check")
        limit = None if full else SHORT
        for i, spec in enumerate(specs):
            if i:
                typer.echo("")
            try:
                asyncio.run(check_source(cfg, spec, limit))
            except StageFailed as exc:
                fail(f"env check: {spec.kind}:{spec.env_id}: {exc}", code=1)
            except KeyboardInterrupt:
                fail("env check: interrupted", code=130)
        typer.echo("ok")

    @env_app.command("run", context_settings=OVERRIDES, epilog=EPILOG)
    def run(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption,
            episodes: int = typer.Option(4, "--episodes", "-n", min=1, help="Episodes to play (tasks in the run's "
                                         "order, one episode each)."),
            url: str = typer.Option(None, "--url", help="A served model's engine (SGLang-native /generate) instead "
                                    "of the embedded engine; the tokenizer is model.path's."),
            out: Path = typer.Option(None, "--out", help="Write the transcripts as JSONL (one episode a line)."),
            full: bool = typer.Option(False, "--full", help="Show messages and turns whole.")) -> None:
        """Play a few episodes with a model: each as a transcript, then a summary.

        The model is the run's (default the tiny model) on the embedded engine, or a served one (--url). A
        transcript shows the policy's turns (decoded), the observations and the rewards; the summary the mean
        reward, turns and drops by reason.

        Exits 1 when the engine or the environment cannot be started or every episode was dropped, 2 on a
        config error."""
        from slimecli.cli.serve import served_config
        from slimecli.env.sources import source_specs
        from slimecli.launch.preflight import engine_errors, materialize, tokenizer_errors
        from slimecli.model.loading import load_tokenizer, set_trust_remote_code

        if url is not None and not url.startswith(("http://", "https://")):
            fail(f"--url: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:30000)")
        overrides = split_overrides(ctx.args)
        cfg = load_config_or_exit(overrides, recipe_dir)
        if not source_specs(cfg.env):
            _no_environment("run")
        # the embedded engine's device and model files, or (--url) the tokenizer's
        cfg = served_config(cfg, overrides, lambda c: tokenizer_errors(c) if url else engine_errors(c, []))
        set_trust_remote_code(cfg.model.trust_remote_code)
        try:
            cfg = materialize(cfg)  # model=tiny is made on first use
            tokenizer = load_tokenizer(cfg.model.resolved_tokenizer_path)
        except (OSError, ValueError) as exc:
            fail(f"env run: the tokenizer of {cfg.model.path or cfg.model.name}: {exc}", code=1)
        limit = None if full else SHORT
        results = _play(cfg, tokenizer, url, episodes)
        rows = []
        for number, (rec, sample, events) in enumerate(results, 1):
            typer.echo("\n".join(transcript(number, len(results), rec, sample, events, limit)))
            rows.append(jsonl_row(number, rec, sample, events))
        typer.echo("\n".join(summary([s for _, s, _ in results])))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("w") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            echo_err(f"env run: {len(rows)} transcript(s) -> {out}")
        if all(s.remove_sample for _, s, _ in results):
            fail("env run: every episode was dropped (see the reasons above)", code=1)


def _play(cfg: SlimeConfig, tokenizer: Any, url: str | None, episodes: int
          ) -> list[tuple[dict[str, Any], Any, list[dict[str, Any]]]]:
    """The episodes against the embedded engine (started and stopped here) or `url`, through EnvRollout."""
    import tempfile

    from slimecli.cli.serve import run_until_signal
    from slimecli.env.rollout import EnvRollout
    from slimecli.env.sources import open_sources, record
    from slimecli.rollout.client import EngineClient, EngineError
    from slimecli.rollout.data import PromptSource

    try:
        sources = open_sources(cfg.env, cfg.task, cfg.env.split)
    except Exception as exc:
        fail(f"env run: load failed: {type(exc).__name__}: {exc}", code=1)
    for source in sources:
        source.provider = RecordingProvider(source.provider)  # type: ignore[assignment]
    engine_proc = None
    workdir = Path(tempfile.mkdtemp(prefix="slimecli-env-")) if url is None else None
    if workdir is not None:
        from slimecli.agent.api.service import EngineProcess

        engine_proc = EngineProcess(cfg, workdir)  # its config and log; removed at the end
    engine_url = url or engine_proc.url  # type: ignore[union-attr]
    client = EngineClient(engine_url, timeout_s=cfg.rollout.request_timeout_s, api_key=cfg.rollout.api_key)
    rollout = EnvRollout(cfg, tokenizer, [RecordingEngine(client, tokenizer)], PromptSource(cfg.task, cfg.run.seed),
                         sources=sources)

    async def one(position: int) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        _EVENTS.set(events)  # this task's own context: the episode's events only
        rec = record(rollout.sources, position, cfg.run.seed, cfg.task.shuffle)
        sample = await rollout.episode(rec, position, position)
        state = f"dropped ({sample.metadata.get('drop_reason')})" if sample.remove_sample \
            else f"reward {float(sample.reward):g}"
        echo_err(f"env run: episode {position + 1}/{episodes}: {state}, {sample.metadata.get('turns', 0)} turn(s)")
        return rec, sample, events

    async def main() -> list[tuple[dict[str, Any], Any, list[dict[str, Any]]]]:
        try:
            if engine_proc is not None:
                echo_err(f"env run: starting the engine ({cfg.model.path}) on {engine_url}")
                engine_proc.start()
                await wait_engine(client, engine_proc, cfg.rollout.start_timeout_s)
            elif not await client.health():
                raise RuntimeError(f"no engine answers at {engine_url} (GET /health)")
            return list(await asyncio.gather(*(one(i) for i in range(episodes))))
        finally:
            await rollout.stop()
            await client.close()
            if engine_proc is not None:
                await asyncio.to_thread(engine_proc.stop)
            if workdir is not None:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)

    try:
        return run_until_signal(main())
    except KeyboardInterrupt:
        fail("env run: interrupted", code=130)
    except (*ROLLOUT_FAILURES, EngineError) as exc:
        fail(f"env run: {exc}", code=1)
