"""A server's readiness or health: does GET ``url`` answer ``status`` in time (blocking, stdlib only: the
supervisor probes from threads of its own, without an event loop)."""

from __future__ import annotations

import urllib.error
import urllib.request


def probe_ok(url: str, status: int = 200, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            code: int = resp.status  # urlopen's result is untyped in the stubs
            return code == status
    except urllib.error.HTTPError as exc:
        return exc.code == status
    except (OSError, ValueError):  # refused, reset, timed out, or not an HTTP answer
        return False
