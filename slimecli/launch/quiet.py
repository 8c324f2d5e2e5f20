"""Library noise the console leaves out: lines children print that tell a user nothing about their run.

Every line still goes to RUN/logs/<name>.log; only the console skips these, empty lines and libraries' Python
warnings among them (`slimecli train --verbose`, i.e. observe.verbose=true, shows them). One list, matched against the line without the prefixes torch puts
in front of it, so that adding a pattern is one line here and one sample line in the test.
"""

from __future__ import annotations

import os
import re

# What torch's loggers put before a message ("W1205 13:46:33.491000 5891 torch/distributed/run.py:874] ") and
# torchrun's per-rank tags ("[rank0]:", "[default0]:").
_PREFIX = re.compile(r"^(?:[DIWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ?|\[(?:rank|default)\d+\]: ?)+")

# A Python warning as the warnings module prints it ("PATH:LINE: CATEGORY: message", then the source line indented),
# or as slimecli's workers print it, on one line (observe/worker.py). A library's (any file outside slimecli) is
# noise; slimecli's own warnings are shown.
_WARNING = re.compile(r"^(?P<path>\S[^:]*\.py):\d+: (?:[A-Za-z_][\w.]*\.)?[A-Z]\w*Warning: ")
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the slimecli package
LIBRARY_WARNING = "a library's warning (warnings module)"

NOISE: tuple[tuple[str, re.Pattern[str]], ...] = (
    # torchrun with several processes per node, each message line behind its own prefix
    ("torchrun OMP_NUM_THREADS banner", re.compile(r"^Setting OMP_NUM_THREADS environment variable for each process")),
    ("a banner's rule of asterisks", re.compile(r"^\*{10,}\s*$")),
    ("an empty line (or the empty first line of a multi-line log message)", re.compile(r"^\s*$")),
    # tqdm bars of transformers and huggingface_hub: "\rLoading weights: 100%|####| 24/24 [00:00<00:00, ...]"
    ("a model-loading progress bar", re.compile(r"^(?:Loading (?:weights|checkpoint shards)|Fetching \d+ files"
                                                r"|Downloading)\b.*\d+%\|")),
)


def noise(line: str) -> str | None:
    """Which kind of noise ``line`` is (a NOISE name, or LIBRARY_WARNING), or None for a line the console shows."""
    stripped = _PREFIX.sub("", line).lstrip("\r")
    warning = _WARNING.match(stripped)
    if warning is not None:
        return None if os.path.abspath(warning.group("path")).startswith(_OWN) else LIBRARY_WARNING
    for name, pattern in NOISE:
        if pattern.search(stripped):
            return name
    return None


class ConsoleFilter:
    """One child's lines in order: ``noise(line)``, and the source line the warnings module prints under a library's
    warning (indented) is that warning's too."""

    def __init__(self) -> None:
        self._after_warning = False

    def noise(self, line: str) -> str | None:
        after, self._after_warning = self._after_warning, False
        if after and _PREFIX.sub("", line).startswith("  "):
            return LIBRARY_WARNING
        kind = noise(line)
        self._after_warning = kind == LIBRARY_WARNING
        return kind
