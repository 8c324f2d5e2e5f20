"""rollout.sglang_args and rollout.sglang_engine_args read by SGLang's own argument parser before launch.

Without this, a misspelt flag passes pre-flight, the trainer and the other engines start, and only then does
``sglang.launch_server`` exit 2 with argparse's message. Where SGLang is installed, its ``ServerArgs.add_cli_args``
builds the same parser here and each field is parsed on its own (after a placeholder ``--model-path``), so the
error names the field that holds the bad flag. Only the parser runs: ``ServerArgs.__post_init__`` reads the model
and the GPUs, which is the server's job. Where SGLang is not installed (or does not import here), nothing is
checked: the missing package is reported by the machine checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import shlex
from typing import Any

from slimecli.config.errors import ConfigError, did_you_mean
from slimecli.config.schema import SlimeConfig

log = logging.getLogger(__name__)


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting (exit_on_error does not cover unknown flags)."""

    def error(self, message: str) -> Any:
        raise _Refused(message)


def sglang_parser() -> argparse.ArgumentParser | None:
    """SGLang's launch_server parser, or None where SGLang is not installed or does not import."""
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # noqa: BLE001 - an SGLang that cannot import here is the launch's problem; say so
        log.warning("rollout.sglang_args not checked: sglang is installed but does not import here (%s: %s); "
                    "the server will check them when it starts", type(exc).__name__, exc)
        return None
    parser = _Parser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def _problem(parser: argparse.ArgumentParser, flags: list[str]) -> tuple[str, str] | None:
    """argparse's message and a hint for these flags, or None when SGLang takes them."""
    try:
        parser.parse_args(["--model-path", "model", *flags])
    except _Refused as exc:
        message = str(exc)
        known = [o for a in parser._actions for o in a.option_strings]
        unknown = [f.partition("=")[0] for f in flags if f.startswith("-") and f.partition("=")[0] not in known]
        hint = did_you_mean(unknown[0], known) if unknown else ""
        return message, hint or "see python -m sglang.launch_server --help for the flags this SGLang takes"
    return None


def sglang_args_errors(cfg: SlimeConfig, parser: argparse.ArgumentParser | None = None) -> list[ConfigError]:
    """Each of rollout.sglang_args and rollout.sglang_engine_args[i] that SGLang's parser refuses."""
    r = cfg.rollout
    if r.name != "sglang" or not (r.sglang_args.strip() or any(a.strip() for a in r.sglang_engine_args)):
        return []
    parser = parser or sglang_parser()
    if parser is None:
        return []
    errors = []
    for path, text in [("rollout.sglang_args", r.sglang_args),
                       *((f"rollout.sglang_engine_args[{i}]", t) for i, t in enumerate(r.sglang_engine_args))]:
        try:
            flags = shlex.split(text)
        except ValueError:
            continue  # the config rules report an unclosed quote
        problem = _problem(parser, flags)
        if problem:
            errors.append(ConfigError(path, text, f"SGLang's parser refuses it: {problem[0]}", problem[1]))
    return errors
