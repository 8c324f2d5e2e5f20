"""`slimecli recipes list|show|copy`: the shipped recipes and your own."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from slimecli.cli.common import RecipeDirOption, fail

recipes_app = typer.Typer(help="List, show and copy recipes (the `recipe` group used with +recipe=NAME).",
                          no_args_is_help=True, rich_markup_mode="rich")


@recipes_app.command("list")
def list_(recipe_dir: list[str] = RecipeDirOption) -> None:
    """Every recipe with its description (the first paragraph of its leading comment), wrapped to the terminal."""
    import shutil
    import textwrap

    from slimecli.config.recipes import available

    found = available(recipe_dir)
    width = max((len(n) for n in found), default=0)
    columns = max(shutil.get_terminal_size().columns, width + 2 + 30)  # at least 30 columns of text
    for name, recipe in found.items():
        text = textwrap.fill(recipe.description, columns, initial_indent=f"{name:<{width}}  ",
                             subsequent_indent=" " * (width + 2), break_long_words=False, break_on_hyphens=False)
        typer.echo(text or name)


def _get(name: str, recipe_dir: list[str]):
    from slimecli.config.errors import allowed_hint
    from slimecli.config.recipes import available, resolve

    recipe = resolve(name, recipe_dir)
    if recipe is None:
        fail(f"unknown recipe {name!r}; {allowed_hint(name, available(recipe_dir))}")
    return recipe


@recipes_app.command("show")
def show(name: str = typer.Argument(..., help="Recipe name or path."), recipe_dir: list[str] = RecipeDirOption) -> None:
    """Print a recipe's YAML."""
    typer.echo(_get(name, recipe_dir).path.read_text(), nl=False)


@recipes_app.command("copy", epilog="""[bold]Example[/]

  slimecli recipes copy quickstart ./my.yaml && slimecli train +recipe=./my.yaml""")
def copy(name: str = typer.Argument(..., help="Recipe to start from."),
         dest: Path = typer.Argument(..., help="Destination file or directory."),
         force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
         recipe_dir: list[str] = RecipeDirOption) -> None:
    """Copy a recipe to start your own; use it with +recipe=PATH or --recipe-dir DIR +recipe=NAME."""
    recipe = _get(name, recipe_dir)
    target = dest / recipe.path.name if dest.is_dir() else dest
    if target.exists() and not force:
        fail(f"{target} exists; pass --force to overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recipe.path, target)
    typer.echo(f"wrote {target}; use it with: slimecli train +recipe={target}")


def register(app: typer.Typer) -> None:
    app.add_typer(recipes_app, name="recipes")
