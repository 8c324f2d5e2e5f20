"""The command tree as `--help` shows it: each group's Commands panel, read from the help text a user sees, so that
a command added later is found without a list to update."""

from __future__ import annotations

import re
from collections.abc import Callable

_PANEL = re.compile(r"^╭─ Commands ─")
_ROW = re.compile(r"^│ (\S+)(?:\s|│)")


def listed_commands(help_text: str) -> list[str]:
    """The names in the Commands panel of one `--help` output (none for a command without sub-commands)."""
    names, inside = [], False
    for line in help_text.splitlines():
        if _PANEL.match(line):
            inside = True
        elif inside and line.startswith("╰"):
            inside = False
        elif inside and (row := _ROW.match(line)):
            names.append(row.group(1))
    return names


def command_tree(help_of: Callable[[list[str]], str]) -> dict[tuple[str, ...], list[str]]:
    """Every command path below the root (`("tasks", "env", "build")`) mapped to the names its own `--help` lists
    (empty for a leaf); ``help_of(path)`` returns the `--help` output of `slimecli PATH --help`."""
    tree: dict[tuple[str, ...], list[str]] = {}
    todo: list[tuple[str, ...]] = [()]
    while todo:
        path = todo.pop(0)
        names = listed_commands(help_of(list(path)))
        tree[path] = names
        todo += [(*path, name) for name in names]
    return tree


def leaves(tree: dict[tuple[str, ...], list[str]]) -> list[tuple[str, ...]]:
    """The commands that run something (no sub-commands of their own)."""
    return [path for path, names in tree.items() if path and not names]
