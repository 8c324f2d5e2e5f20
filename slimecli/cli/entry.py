"""The `slimecli` command's entry point: a command that launches a run starts the run's template first
(launch/forked.py: start_early), before the command line is parsed; then the Typer app runs."""

from __future__ import annotations

import sys

EARLY_COMMANDS = (("train",), ("eval",), ("teacher", "serve"))  # their processes fork from the run's template
SERVING_COMMANDS = (("eval",),)  # ... which runs engines and evaluators only (launch/template.py: SERVING_PRELOAD)
NOT_A_RUN = frozenset({"-h", "--help", "--version", "--dry-run"})


def launches_a_run(args: list[str]) -> bool:
    """Whether `slimecli ARGS` starts a run's processes (every other command leaves launch/ unimported)."""
    return any(tuple(args[:len(c)]) == c for c in EARLY_COMMANDS) and not NOT_A_RUN & set(args)


def main() -> None:
    if launches_a_run(sys.argv[1:]):
        from slimecli.launch.forked import start_early

        start_early(serving=any(tuple(sys.argv[1:1 + len(c)]) == c for c in SERVING_COMMANDS))
    from slimecli.cli.app import main as app_main

    app_main()
