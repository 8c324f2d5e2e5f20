"""`slimecli env list|check|run`: RL environments (env=KIND env.id=ID, slimecli/env/): what is installed, one
environment reset and stepped once, a few episodes played by a model with their transcripts.

Not a SWE task's environment (task.environment, `slimecli tasks env`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

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
ROLLOUT_FAILURES = (RuntimeError, OSError, TimeoutError, ValueError)


# ---- env list --------------------------------------------------------------------------------------------------
def list_kind(kind: str) -> tuple[str, list[tuple[str, str]] | None]:
    """(the kind's heading, its rows): what available() lists, or None with the heading saying why nothing can be
    listed."""
    import importlib.metadata
    import importlib.util

    from slimecli.env.adapters import adapter, install_hint
    from slimecli.env.render import shorten

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
    except Exception as exc:  # noqa: BLE001 - a library that is there but cannot list its environments: said below
        return f"{heading}: cannot list its environments: {type(exc).__name__}: {shorten(str(exc))}", None
    return heading, [(str(name), str(origin)) for name, origin in rows]


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
        import asyncio  # here, not at the top: every command imports this module

        from slimecli.env.probe import StageFailed, probe_source
        from slimecli.env.render import SHORT
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
                asyncio.run(probe_source(cfg, spec, limit, typer.echo))
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
        from slimecli.env.render import SHORT
        from slimecli.env.sources import source_specs
        from slimecli.env.transcript import jsonl_row, summary, transcript
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
    import asyncio

    from slimecli.agent.api.service import EngineProcess, wait_engine
    from slimecli.cli.serve import run_until_signal
    from slimecli.env.rollout import EnvRollout
    from slimecli.env.sources import open_sources, record
    from slimecli.env.transcript import RecordingEngine, RecordingProvider, record_events
    from slimecli.rollout.client import EngineClient, EngineError
    from slimecli.rollout.data import PromptSource

    try:
        sources = open_sources(cfg.env, cfg.task, cfg.env.split)
    except Exception as exc:  # noqa: BLE001 - any load failure is reported, exit 1
        fail(f"env run: load failed: {type(exc).__name__}: {exc}", code=1)
    for source in sources:
        source.provider = RecordingProvider(source.provider)  # type: ignore[assignment]
    engine_proc = EngineProcess(cfg) if url is None else None  # its config and log: removed once it stops
    engine_url = url or engine_proc.url  # type: ignore[union-attr]
    client = EngineClient(engine_url, timeout_s=cfg.rollout.request_timeout_s, api_key=cfg.rollout.api_key)
    rollout = EnvRollout(cfg, tokenizer, [RecordingEngine(client, tokenizer)], PromptSource(cfg.task, cfg.run.seed),
                         sources=sources)

    async def one(position: int) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
        events = record_events()  # this task's own context: the episode's events only
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
                await wait_engine(client.health, engine_url, cfg.rollout.start_timeout_s, engine_proc)
            elif not await client.health():
                raise RuntimeError(f"no engine answers at {engine_url} (GET /health)")
            return list(await asyncio.gather(*(one(i) for i in range(episodes))))
        finally:
            await rollout.stop()
            await client.close()
            if engine_proc is not None:
                await asyncio.to_thread(engine_proc.stop)

    try:
        return run_until_signal(main())
    except KeyboardInterrupt:
        fail("env run: interrupted", code=130)
    except (*ROLLOUT_FAILURES, EngineError) as exc:
        fail(f"env run: {exc}", code=1)
