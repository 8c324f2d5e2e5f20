"""The `slimecli` command's entry point: a command that launches a run starts the run's template first
(launch/forked.py: start_early), before the command line is parsed; then the Typer app runs."""

from __future__ import annotations

import sys


def main() -> None:
    from slimecli.launch.forked import start_early

    start_early(sys.argv[1:])
    from slimecli.cli.app import main as app_main

    app_main()
