"""A server's readiness or health: does GET ``url`` answer ``status`` in time (blocking, stdlib only: the
supervisor probes from threads of its own, without an event loop)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

FIRST_POLL_S = 0.05


def probe_ok(url: str, status: int = 200, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            code: int = resp.status  # urlopen's result is untyped in the stubs
            return code == status
    except urllib.error.HTTPError as exc:
        return exc.code == status
    except (OSError, ValueError):  # refused, reset, timed out, or not an HTTP answer
        return False


def poll_delays(most_s: float, first_s: float = FIRST_POLL_S) -> Iterator[float]:
    """The waits between readiness polls: from `first_s`, half again longer each time, up to `most_s`. A server
    that starts in a second is seen within tens of milliseconds of it; one that loads for minutes is still polled
    only every `most_s`."""
    delay = min(first_s, most_s)
    while True:
        yield delay
        delay = min(most_s, delay * 1.5)
