"""Why a child failed, in one line, from the tail of its log.

torchrun ends a failed run with its own traceback (ChildFailedError) and a banner; the worker's real
error comes before them. This finds it: the exception of the first traceback a worker printed, else the
last line a worker printed before torchrun's report, and the rank torchrun names as the root cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PREFIX = re.compile(r"^\[(?:rank|default)?(\d+)\]:\s?")  # torchrun --tee / the ranks' own prefixes
_TORCHRUN = re.compile(r"torch[/.]distributed[/.](elastic|run)|ChildFailedError|^[WEI]\d{4} \d\d:\d\d:\d\d|"
                       r"^\*{5,}$|OMP_NUM_THREADS|^=+$|^-+$")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+ \S+ (DEBUG|INFO) ")  # logging's format
_FAILED_RANK = re.compile(r"failed \(exitcode: -?\d+\) local_rank: (\d+)")
MAX_CHARS = 300


def _strip(line: str) -> tuple[str, int | None]:
    m = _PREFIX.match(line)
    return (line[m.end():], int(m.group(1))) if m else (line, None)


def strip_prefix(line: str) -> str:
    return _strip(line)[0]


def _torchrun_report_start(lines: Sequence[str]) -> int:
    for i, line in enumerate(lines):
        if _FAILED_RANK.search(line) or "ChildFailedError" in line or "Sending process" in line and "SIGTERM" in line:
            return i
    return len(lines)


def _root_cause(lines: Sequence[str]) -> tuple[int | None, int | None]:
    """(rank, exit code) of torchrun's "Root Cause" entry (a negative code: killed by that signal)."""
    rank = code = None
    for i, line in enumerate(lines):
        if "Root Cause" in line:
            for after in lines[i + 1:i + 9]:
                if (m := _ROOT_RANK.match(after)) and rank is None:
                    rank = int(m.group(1))
                elif (m := _ROOT_EXIT.match(after)) and code is None:
                    code = int(m.group(1))
    if rank is None:
        for line in lines:
            if m := _FAILED_RANK.search(line):
                return int(m.group(1)), code
    return rank, code


def _signal_name(code: int) -> str:
    import signal

    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _exception(lines: Sequence[str]) -> tuple[str, int | None] | None:
    """The exception line ending the first traceback (a worker's, not torchrun's), with its prefix's rank."""
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        for after in lines[i + 1:]:
            text, rank = _strip(after)
            if text and not text[0].isspace() and not text.startswith("Traceback"):
                if "ChildFailedError" in text or text.startswith("KeyboardInterrupt"):
                    break
                return text.strip(), rank
    return None


def reason(lines: Sequence[str]) -> str:
    """'rank 1: ValueError: ...', or the worker's last line, or '' when the log says nothing useful."""
    own = list(lines[:_torchrun_report_start(lines)])
    root_rank, root_code = _root_cause(lines)
    found = _exception(own)
    rank = None
    if found is not None:
        text, rank = found
    elif root_code is not None and root_code < 0:
        text = f"was killed by {_signal_name(root_code)}"
        return f"rank {root_rank} {text}" if root_rank is not None else text
    else:
        candidates = [_strip(line) for line in own if line.strip() and not _TORCHRUN.search(_strip(line)[0].strip())
                      and not _LOG_LINE.match(_strip(line)[0])]
        if not candidates:
            return f"rank {root_rank} exited with code {root_code}" if root_rank is not None and root_code else ""
        text, rank = candidates[-1]
        text = text.strip()
    rank = rank if rank is not None else root_rank
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + "..."
    return f"rank {rank}: {text}" if rank is not None else text


def summary(name: str, what: str, lines: Sequence[str], log_path: object) -> str:
    """The one line a user reads last: which process, why, where its log is."""
    why = reason(lines)
    return f"{name} failed: {why} ({what}; full log: {log_path})" if why else f"{name} failed ({what}; full log: {log_path})"
