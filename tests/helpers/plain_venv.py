"""A venv holding links to this interpreter's packages, some left out: what a user without an extra has, made with
no download."""

from __future__ import annotations

import sys
import venv
from pathlib import Path


def linked_venv(root: Path, leave_out: tuple[str, ...]) -> Path:
    """A venv at `root` whose site-packages links every package of this one except names starting (lower-cased)
    with one of `leave_out`; returns its python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = next(root.glob("lib/python*/site-packages"))
    here = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)))
    for entry in here.iterdir():
        if not entry.name.lower().startswith(leave_out):
            (site / entry.name).symlink_to(entry)
    return root / "bin" / "python"
