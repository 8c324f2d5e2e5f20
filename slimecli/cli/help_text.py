"""Help text that wraps to the terminal: the docstrings' and help strings' line breaks inside a paragraph are
the source's, not the reader's, so each prose paragraph becomes one line that rich wraps at the terminal's width.
A paragraph laid out by hand (an indented line: examples, a table; or click's \\b marker) keeps its lines."""

from __future__ import annotations

import inspect

import typer


def unwrap(text: str) -> str:
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines = paragraph.split("\n")
        if paragraph.startswith("\b") or any(line[:1].isspace() or line.lstrip().startswith(("- ", "* "))
                                             for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


def tidy(app: typer.Typer) -> None:
    """Unwrap the help of ``app``, of its commands and of its groups, recursively (before click sees them)."""
    if isinstance(app.info.help, str):
        app.info.help = unwrap(app.info.help)
    for command in app.registered_commands:
        text = command.help if isinstance(command.help, str) else inspect.getdoc(command.callback)
        if text:
            command.help = unwrap(text)
        if isinstance(command.epilog, str):
            command.epilog = unwrap(command.epilog)
    for group in app.registered_groups:
        if isinstance(group.help, str):
            group.help = unwrap(group.help)
        if group.typer_instance is not None:
            tidy(group.typer_instance)
