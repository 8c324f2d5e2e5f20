"""`slimecli eval`: evaluate a checkpoint or a finished run on held-out datasets (eval.datasets)."""

from __future__ import annotations

import sys

import typer

from slimecli.cli.common import OVERRIDES, RecipeDirOption, fail, split_overrides


def register(app: typer.Typer) -> None:
    @app.command("eval", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli eval run.dir=runs/quickstart-20260101-120000      # the run's final policy, the run's eval settings

  slimecli eval model.path=runs/q/final                      # the quickstart's held-out set (the default eval)

  slimecli eval +recipe=env_lookup model.path=runs/l/final   # an environment's eval split (each source a dataset)

  slimecli eval model.path=/ckpt 'eval.datasets=[{name: test, task: jsonl, path: test.jsonl, temperature: 0.6}]'""")
    def eval_(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
        """Evaluate: engines serve the model, every eval dataset is sampled and scored, a table of the metrics.

        Writes eval/step_<N>/<name>.jsonl (a line per sample), the summary and metrics.jsonl into its own directory.

        Exits 1 if any dataset could not be evaluated, 2 on a config error.
        """
        from slimecli.config.errors import ConfigErrors
        from slimecli.eval.standalone import evaluate, resolve

        overrides = split_overrides(ctx.args)
        try:
            cfg, step = resolve(overrides, tuple(recipe_dir))
            code = evaluate(cfg, step, sys.argv, overrides)
        except ConfigErrors as exc:
            fail(exc.render())
        raise typer.Exit(code)
