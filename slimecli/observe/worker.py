"""How every worker process starts (trainer, evaluator, teacher, engine): `--config RUN/config.yaml` and its own
arguments parsed, the frozen config read (a bad one: the message on stderr, exit 2, no traceback), and the
log configured at run.log_level, Python warnings printed on one line, so that the four entry points cannot drift
apart."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

from slimecli.config.io import load_frozen_or_exit
from slimecli.config.schema import SlimeConfig

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def start_worker(prog: str, argv: Sequence[str] | None, description: str | None = None,
                 arguments: Callable[[argparse.ArgumentParser], object] | None = None,
                 log_format: str | None = LOG_FORMAT) -> tuple[SlimeConfig, argparse.Namespace]:
    """The worker's config and arguments. ``arguments`` adds the worker's own; ``log_format`` None leaves the
    log to the worker (the engine configures it with its server)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", required=True, help="the run's resolved config (RUN/config.yaml)")
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    cfg = load_frozen_or_exit(args.config)
    # the supervisor's stall watchdog (launch/stall.py) asks for every thread's Python stacks with SIGUSR1
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    if log_format is not None:
        logging.basicConfig(level=cfg.run.log_level.upper(), stream=sys.stderr, format=log_format)
    warnings.showwarning = one_line_warning
    return cfg, args


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
    """A Python warning as one line, "PATH:LINE: CATEGORY: message" (the warnings module's first line, without the
    source line under it): the controller's console leaves out a library's (launch/quiet.py), its log keeps it."""
    text = " ".join(str(message).split())
    try:
        print(f"{filename}:{lineno}: {category.__name__}: {text}", file=file or sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed stream: as the warnings module, never fail for a warning
        pass
