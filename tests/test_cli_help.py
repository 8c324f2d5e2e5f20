"""`--help` text wraps to the terminal: a prose paragraph of any command's help is one line on a terminal wide
enough for it, and is wrapped at the terminal's width on a narrow one, never at the line breaks of its source."""

from __future__ import annotations

import re

import pytest

from slimecli.cli.help_text import unwrap
from tests.helpers import invoke_cli
from tests.helpers.cli_tree import command_tree


def help_at(width: int, path: list[str]) -> str:
    out = invoke_cli(*path, "--help", env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def tree() -> dict[tuple[str, ...], list[str]]:
    return command_tree(lambda path: help_at(400, path))


def broken_lines(text: str) -> list[str]:
    """Lines that continue the line above where nothing made them: in the Commands panel, a row without a name;
    in the description, a prose line right under another (a paragraph that wrapped at 400 columns)."""
    found, panel, previous = [], "", ""
    for line in text.splitlines():
        if line.startswith("╭─"):
            panel = line
        elif line.startswith("╰"):
            panel = ""
        elif "Commands" in panel and re.match(r"^│ {3,}\S", line):
            found.append(line)
        elif not panel and line.startswith(" ") and not line.startswith("   ") and line.strip() \
                and previous.strip() and not previous.startswith("   ") and "Usage:" not in previous:
            found.append(line)
        previous = line if not panel else ""
    return found


def test_every_help_text_is_unwrapped(tree: dict[tuple[str, ...], list[str]]) -> None:
    assert len(tree) > 30  # groups and commands
    broken = {" ".join(path): lines for path in tree if (lines := broken_lines(help_at(400, list(path))))}
    assert not broken, broken


def test_a_narrow_terminal_wraps_at_its_width() -> None:
    text = help_at(60, ["report"])
    assert all(len(line) <= 60 for line in text.splitlines())
    wide = help_at(400, ["report"])
    assert "response length, step time) and report.html" in wide  # one line where the docstring had a break


def test_unwrap_keeps_what_is_laid_out_by_hand() -> None:
    text = """One sentence
    over two lines.

    [bold]Examples[/]
      slimecli train
      slimecli eval

    - a list
    - kept"""
    assert unwrap(text) == ("One sentence over two lines.\n\n[bold]Examples[/]\n  slimecli train\n  slimecli eval\n\n"
                            "- a list\n- kept")
