"""The `slimecli` entry point. Command modules are imported here; none of them imports torch at load time."""

from __future__ import annotations

import importlib
import sys

import typer

from slimecli import __version__
from slimecli.cli.help_text import tidy

HELP = """Declarative RL post-training of language models: compose a run from Hydra config groups,
validate it before anything expensive starts, launch and supervise trainer, engines and teacher.

Any `key=value` after a command is a Hydra override, `group=member` picks a group member,
and `+recipe=NAME` (or `+recipe=/path/my.yaml`) adds a recipe.

[bold]Examples[/]
  slimecli train                                        # embedded quickstart on CPU
  slimecli train +recipe=opd teacher.model_path=RUN/final     # distil from a finished run
  slimecli config show +recipe=opd teacher.url=http://127.0.0.1:7999
  slimecli config validate +recipe=opd
  slimecli plan +recipe=opd teacher.url=http://127.0.0.1:7999 --json
  slimecli agent run agent=codex task.prompt="add a README" task.workdir=DIR
  slimecli teacher serve model.path=/ckpt teacher.tp=2
  slimecli eval run.dir=RUN                            # the run's final policy on its eval datasets
  slimecli recipes list
"""

app = typer.Typer(help=HELP, rich_markup_mode="rich", no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})

# One module per command family; each exposes register(app).
COMMAND_MODULES = ("train", "config", "plan", "recipes", "rollout", "teacher", "model", "agent", "tasks", "report", "eval",
                   "env")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"slimecli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"slimecli.cli.{_name}")
    except ModuleNotFoundError as _exc:  # a command family not built yet
        if _exc.name != f"slimecli.cli.{_name}":
            raise
        continue
    _module.register(app)
tidy(app)


def main() -> None:
    try:
        app()
    except SystemExit as exc:
        if "torch" in sys.modules:  # a command that loaded it (a tokenizer, an in-process model): a second saved
            from slimecli.quick_exit import exit_code, exit_now

            exit_now(exit_code(exc))
        raise
