"""The config errors a command line gets, as the user reads them: `errors_of` (each rendered error) and
`errors_by_key` (the rendered error by its key). Both compose, check every rule and read the files the config
names, as every command does (launch.source_checks.load), and fail the test when the config loads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from slimecli.config.errors import ConfigError, ConfigErrors


def config_errors(overrides: Iterable[str], **kw: Any) -> list[ConfigError]:
    from slimecli.launch.source_checks import load

    with pytest.raises(ConfigErrors) as info:
        load(list(overrides), **kw)
    return info.value.errors


def errors_of(overrides: Iterable[str], **kw: Any) -> list[str]:
    """Each error rendered (key, value, reason, hint), in the order they are reported."""
    return [e.render() for e in config_errors(overrides, **kw)]


def errors_by_key(*overrides: str, **kw: Any) -> dict[str, str]:
    """The rendered error of each key (the last one, where a key has several)."""
    return {e.path: e.render() for e in config_errors(overrides, **kw)}
