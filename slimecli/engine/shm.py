"""The host's shared-memory segments for weights: where they live, what they are called, who owns them.

Torch-free, so the pre-flight can size the tmpfs without importing torch.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from slimecli.process import alive

SEGMENT_PREFIX = "slimecli-weights-"  # then the writer's pid, '-', a random id
_SEGMENT_NAME = re.compile(r"slimecli-weights-[A-Za-z0-9_.-]{1,200}")


def segment_dir() -> Path:
    """The host's tmpfs where there is one (pages there are RAM, never written to a disk)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def segment_path(name: object) -> Path:
    """The segment a request names; only slimecli's own segment names are accepted (never an arbitrary file)."""
    if not isinstance(name, str) or not _SEGMENT_NAME.fullmatch(name):
        raise ValueError(f"segment: must be a name {SEGMENT_PREFIX}<id> of letters, digits, '._-'")
    return segment_dir() / name


def remove_stale_segments() -> int:
    """Segments whose writer (the pid in their name) is gone: a trainer killed -9 leaves its RAM behind."""
    removed = 0
    for path in segment_dir().glob(SEGMENT_PREFIX + "*"):
        pid = path.name.removeprefix(SEGMENT_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            path.unlink(missing_ok=True)
            removed += 1
    return removed
