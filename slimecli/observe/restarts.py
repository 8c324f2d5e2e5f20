"""RUN/restarts.jsonl: the servers the supervisor restarted, one line each ({time, server, restart, why}); the
trainer's metrics count them (run/server_restarts)."""

from __future__ import annotations

import json
import time
from pathlib import Path

RESTARTS_FILE = "restarts.jsonl"


def record_restart(path: Path, server: str, restart: int, why: str) -> None:
    line = {"time": time.time(), "server": server, "restart": restart, "why": why}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def count_restarts(path: Path) -> int:
    """How many server restarts the file records (0 without it)."""
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0
