"""`slimecli train`: compose, validate, then launch and supervise engines, teacher and trainer."""

from __future__ import annotations

import sys

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, fail, load_config_or_exit, split_overrides


def register(app: typer.Typer) -> None:
    @app.command("train", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli train                                   # embedded quickstart: tiny model, CPU, minutes

  slimecli train optimizer=stateless_adam trainer.max_steps=20

  slimecli train run.dir=runs/mine                 # run again with the same run.dir to resume

  slimecli train +recipe=opd teacher=server teacher.url=http://127.0.0.1:7999""")
    def train(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
        """Train: rollout engines and teacher start first, then the trainer under torchrun."""
        from slimecli.config.errors import ConfigErrors
        from slimecli.launch.controller import run

        overrides = split_overrides(ctx.args)
        cfg = load_config_or_exit(overrides, recipe_dir)
        try:
            code = run(cfg, sys.argv, overrides)
        except ConfigErrors as exc:  # checks that need the model files
            fail(exc.render())
        raise typer.Exit(code)
