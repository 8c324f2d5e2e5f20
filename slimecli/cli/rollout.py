"""`slimecli rollout serve`: the embedded rollout engine (SGLang's native HTTP API) as a standalone server."""

from __future__ import annotations

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, command_group, load_config_or_exit, split_overrides


def register(app: typer.Typer) -> None:
    rollout_app = command_group(app, "rollout", "Rollout engines: serve the embedded engine.")

    @rollout_app.command("serve", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli rollout serve                                  # the tiny model on a free port; prints its URL

  slimecli rollout serve model.path=/ckpt/qwen3-0.6b rollout.port=30001 model.dtype=bfloat16""")
    def serve(ctx: typer.Context, index: int = typer.Option(0, "--index", help="Listen on rollout.port + INDEX."),
              recipe_dir: list[str] = RecipeDirOption) -> None:
        """Serve /generate and the rest of SGLang's native API for model.path (or model=tiny)."""
        from slimecli.cli.serve import run_dir_or_exit, served_config
        from slimecli.config.layout import engine_slot
        from slimecli.engine.__main__ import start
        from slimecli.launch.free_ports import with_free_rollout_port
        from slimecli.launch.preflight import materialize, rollout_serve_errors

        overrides = split_overrides(ctx.args)
        cfg = served_config(load_config_or_exit(overrides, recipe_dir), overrides,
                            lambda c: rollout_serve_errors(c, index), name="rollout",
                            ports=lambda c: with_free_rollout_port(c, engines=index + 1))  # engine INDEX: a free port
        cfg = materialize(cfg)
        run = run_dir_or_exit(cfg, overrides)
        typer.echo(f"rollout: run dir {run.path}; serving on {engine_slot(cfg, index).url}", err=True)
        start(cfg, index, run.path)
