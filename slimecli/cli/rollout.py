"""`slimecli rollout serve`: the embedded rollout engine (SGLang's native HTTP API) as a standalone server."""

from __future__ import annotations

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, fail, load_config_or_exit, split_overrides


def register(app: typer.Typer) -> None:
    rollout_app = typer.Typer(help="Rollout engines: serve the embedded engine.", no_args_is_help=True)

    @rollout_app.command("serve", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli rollout serve                                  # the tiny model on a free port; prints its URL

  slimecli rollout serve model.path=/ckpt/qwen3-0.6b rollout.port=30001 model.dtype=bfloat16""")
    def serve(ctx: typer.Context, index: int = typer.Option(0, "--index", help="Listen on rollout.port + INDEX."),
              recipe_dir: list[str] = RecipeDirOption) -> None:
        """Serve /generate and the rest of SGLang's native API for model.path (or model=tiny)."""
        import sys
        from dataclasses import replace

        from slimecli.config.errors import ConfigErrors
        from slimecli.config.layout import engine_slot
        from slimecli.engine.__main__ import start
        from slimecli.launch.free_ports import with_free_rollout_port
        from slimecli.launch.preflight import materialize, rollout_serve_errors
        from slimecli.launch.rundir import prepare

        overrides = split_overrides(ctx.args)
        cfg = load_config_or_exit(overrides, recipe_dir)
        if not any(o.startswith("run.name=") for o in overrides):
            cfg = replace(cfg, run=replace(cfg.run, name="rollout"))
        try:
            cfg = with_free_rollout_port(cfg, engines=index + 1)  # rollout.port=auto: engine INDEX on a free port
        except ConfigErrors as exc:
            fail(exc.render())
        errors = rollout_serve_errors(cfg, index)
        if errors:
            fail(ConfigErrors(errors).render())
        cfg = materialize(cfg)
        try:
            run = prepare(cfg, sys.argv, overrides)  # the resolved config this engine serves, for the record
        except ConfigErrors as exc:  # the run directory is in use, or holds another run
            fail(exc.render())
        typer.echo(f"rollout: run dir {run.path}; serving on {engine_slot(cfg, index).url}", err=True)
        start(cfg, index, run.path)

    app.add_typer(rollout_app, name="rollout")
