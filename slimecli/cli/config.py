"""`slimecli config show|validate`: compose and check a run config without launching anything."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from slimecli.cli.common import (
    OVERRIDES,
    RecipeDirOption,
    load_config_or_exit,
    preflight_or_exit,
    say_sandbox,
    split_overrides,
)

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig

config_app = typer.Typer(help="Inspect and validate a composed run config.", no_args_is_help=True,
                         rich_markup_mode="rich")


@config_app.command("show", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli config show +recipe=swe_agent

  slimecli config show +recipe=swe_agent agent=codex optimizer=stateless_adam optimizer.lr=2e-6""")
def show(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
    """Print the fully resolved YAML (every key, with defaults); nothing is launched."""
    from slimecli.config.io import dump_yaml

    cfg = load_config_or_exit(split_overrides(ctx.args), recipe_dir, resume=True)
    typer.echo(dump_yaml(cfg), nl=False)


@config_app.command("validate", context_settings=OVERRIDES, epilog="""[bold]Examples[/]

  slimecli config validate +recipe=opd teacher.url=http://127.0.0.1:7999

  slimecli config validate optimizer=stateless_adam optimizer.amsgrad=true   # exit 2""")
def validate(ctx: typer.Context, recipe_dir: list[str] = RecipeDirOption) -> None:
    """Exit 0 with a one-line OK, or print every error and exit 2."""
    cfg = load_config_or_exit(split_overrides(ctx.args), recipe_dir, resume=True)
    preflight_or_exit(cfg)
    say_sandbox(cfg)
    typer.echo(f"OK: recipe={cfg.recipe} trainer={cfg.trainer.name} rollout={cfg.rollout.name} "
               f"optimizer={cfg.optimizer.name} reward={cfg.reward.name} {_teachers(cfg)} agent={cfg.agent.name}")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")


def _teachers(cfg: SlimeConfig) -> str:
    """teacher=server, or the listed teachers by name: teachers=math,code."""
    return f"teachers={','.join(t.name for t in cfg.teachers)}" if cfg.teachers else f"teacher={cfg.teacher.name}"
