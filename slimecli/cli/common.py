"""Helpers shared by the command modules: override capture and config errors as exit code 2."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from slimecli.config.schema import SlimeConfig

# Hydra overrides (`key=value`, `group=member`, `+recipe=NAME`) arrive as extra arguments.
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}

RecipeDirOption = typer.Option(
    [], "--recipe-dir", "-r", help="Extra directory of recipe YAML files (repeatable); also $SLIMECLI_RECIPE_PATH.")


def command_group(app: typer.Typer, name: str, help: str) -> typer.Typer:
    """`slimecli NAME ...`: a group of sub-commands added to `app`; called bare, it shows its help."""
    group = typer.Typer(help=help, no_args_is_help=True)
    app.add_typer(group, name=name)
    return group


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` in red on stderr and exit with `code` (2: a usage or config error)."""
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def load_config_or_exit(overrides: list[str], recipe_dirs: list[str] | tuple[str, ...] = (),
                        uses_agent: bool = False, resume: bool = False) -> SlimeConfig:
    """Compose and validate; on any config error print all of them and exit 2 (no traceback). ``resume``: a
    run.dir that holds a run is that run's stored config with the overrides on top (train, plan, config)."""
    from slimecli.config.errors import ConfigErrors
    from slimecli.launch.source_checks import load

    try:
        return load(list(overrides), tuple(recipe_dirs), uses_agent, resume)
    except ConfigErrors as exc:
        fail(exc.render())


def swe_config_or_exit(args: list[str], recipe_dir: list[str], *, sandboxed: bool = False) -> SlimeConfig:
    """`tasks ...` commands are about SWE tasks: task=swe unless the command line says otherwise. `sandboxed`: the
    command runs tests in sandboxes, so one must start here (sandbox=auto where none does: exit 2)."""
    overrides = split_overrides(args)
    if not any(a.split("=", 1)[0] == "task" for a in overrides):
        overrides = ["task=swe", *overrides]
    cfg = load_config_or_exit(overrides, recipe_dir)
    if sandboxed:
        from slimecli.config.errors import ConfigErrors
        from slimecli.launch.agent_checks import sandbox_errors

        errors = sandbox_errors(cfg)
        if errors:
            fail(ConfigErrors(errors).render())
    return cfg


def preflight_or_exit(cfg: SlimeConfig) -> None:
    """The checks `train` makes before it starts anything (slimecli.launch.preflight): exit 2 on any."""
    from slimecli.config.errors import ConfigErrors
    from slimecli.launch.preflight import check

    try:
        check(cfg)
    except ConfigErrors as exc:
        fail(exc.render())


def say_sandbox(cfg: SlimeConfig) -> None:
    """Where the config's agent commands run (stderr): what sandbox=local leaves open, or the kind auto picked.
    Nothing for a config that runs no model-written code."""
    from rich.console import Console

    from slimecli.launch.agent_checks import say_sandbox_notice

    say_sandbox_notice(cfg, Console(stderr=True, highlight=False, soft_wrap=True))


def load_frozen_or_exit(path: str) -> SlimeConfig:
    """A run's frozen config (slimecli.config.io.load_frozen_or_exit: exit 2 with the error, no traceback)."""
    from slimecli.config.io import load_frozen_or_exit

    return load_frozen_or_exit(path)


def split_overrides(args: list[str]) -> list[str]:
    """Reject stray options that typer let through, so a typo is not silently an override."""
    bad = [a for a in args if a.startswith("-")]
    if bad:
        fail(f"unknown option(s): {' '.join(bad)} (overrides look like key=value; see --help)")
    return args


def echo_err(message: str) -> None:
    print(message, file=sys.stderr)
