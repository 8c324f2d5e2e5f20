"""The built-in task sets' names and files (`builtin:NAME`): where a set's tasks.jsonl lives, found without
git or any import of the rest of the package."""

from __future__ import annotations

from pathlib import Path

from slimecli.swe.rows import BUILTIN_PREFIX, TaskFileError

DATA_DIR = Path(__file__).resolve().parent / "data"
SETS: dict[str, str] = {
    "swe_tiny": "bug fixes and small features in tiny stdlib-only Python repositories (seconds per task, on CPU)",
    "swe_tiny_smoke": "swe_tiny, each task listing 3 edits, one correct, for agent.constrain=choices smoke runs",
}


def _available() -> str:
    return ", ".join(BUILTIN_PREFIX + name for name in SETS)


def task_file(name: str) -> Path:
    """The JSONL file of built-in set `name`; TaskFileError naming the sets there are for any other name."""
    if name not in SETS:
        raise TaskFileError(f"{BUILTIN_PREFIX}{name}: no such built-in task set (available: {_available()})")
    return DATA_DIR / name / "tasks.jsonl"
