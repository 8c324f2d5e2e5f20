"""Paths a client names in a request (a checkpoint to load): checked before anything touches the disk.

`request_dir(value, field, roots, setting)` expands `~`, resolves symlinks and `..`, and returns the directory,
or raises HttpError: 400 for what is not a usable path (not a string, empty, NUL bytes, longer than the OS
allows, `~nosuchuser`), 403 naming the resolved path when it lies outside every root (roots None: no rule),
and the setting that admits more roots, so that whoever reads the refusal knows how to allow the path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slimecli.net.server import HttpError

MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX


def request_dir(value: Any, field: str, roots: Sequence[str | Path] | None = None,
                setting: str | None = None) -> Path:
    if not isinstance(value, str) or not value:
        raise HttpError(400, f"{field}: required (a checkpoint directory)")
    if "\x00" in value:
        raise HttpError(400, f"{field}: contains a NUL byte")
    if len(value) > MAX_PATH_CHARS:
        raise HttpError(400, f"{field}: {len(value)} characters, longer than a path may be ({MAX_PATH_CHARS})")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise HttpError(400, f"{field}: not valid Unicode text") from None
    long = next((p for p in raw.split(b"/") if len(p) > MAX_NAME_BYTES), None)
    if long is not None:
        raise HttpError(400, f"{field}: a path component is {len(long)} bytes, longer than a name may be "
                             f"({MAX_NAME_BYTES})")
    expanded = os.path.expanduser(value)
    if expanded.startswith("~"):
        user = value[1:].split("/", 1)[0]
        raise HttpError(400, f"{field}: cannot expand {value[:100]!r}: no user {user[:100]!r} on this host")
    try:
        path = Path(expanded).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, an unreadable component
        raise HttpError(400, f"{field}: cannot resolve {value[:200]}: {exc}") from None
    if roots is not None:
        resolved = [Path(os.path.expanduser(str(r))).resolve() for r in roots]
        if not any(path == r or path.is_relative_to(r) for r in resolved):
            allowed = ", ".join(str(r) for r in resolved) or "(none)"
            how = (f"; to allow it, start the server with {setting}=[{','.join([*map(str, resolved), str(path)])}]"
                   if setting else "")
            raise HttpError(403, f"{field}: {path} is outside the directories this server loads weights from "
                                 f"({allowed}){how}", extra={"model_path": str(path)})
    return path
