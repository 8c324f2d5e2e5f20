"""Reading a task file's rows: JSONL line by line, or parquet (the format the dataset hubs publish) with pyarrow.

Each row comes with where it came from, FILE:LINE (for parquet, the row's number), so that a bad row is
reported at its place; a line that is not JSON is a RowError in the stream, not an exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slimecli.swe.rows import RowError, TaskFileError

PARQUET = (".parquet", ".pq")


def _parquet(file: Path, shown: str) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskFileError(f"{shown}: reading parquet needs pyarrow, which is not installed: "
                            "pip install 'slimecli[datasets]'") from None
    try:
        table = pq.read_table(file)
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise TaskFileError(f"{shown}: cannot read as parquet ({exc})") from None
    for number, row in enumerate(table.to_pylist(), 1):
        yield f"{shown}:{number}", row


def read_rows(file: Path, shown: str) -> Iterator[tuple[str, Any]]:
    """(FILE:LINE, the row or the RowError saying why it is not one) for every non-empty row."""
    if file.suffix.lower() in PARQUET:
        yield from _parquet(file, shown)
        return
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"{shown}: cannot read ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        source = f"{shown}:{number}"
        try:
            yield source, json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            yield source, RowError(source, "<row>", f"not valid JSON ({exc})")
