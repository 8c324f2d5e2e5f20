"""Library noise the console leaves out: lines children print that tell a user nothing about their run.

Every line still goes to RUN/logs/<name>.log; only the console skips these (`slimecli train --verbose`, i.e.
observe.verbose=true, shows them). One list, matched against the line without the prefixes torch puts
in front of it, so that adding a pattern is one line here and one sample line in the test.
"""

from __future__ import annotations

import re

# What torch's loggers put before a message ("W1205 13:46:33.491000 5891 torch/distributed/run.py:874] ") and
# torchrun's per-rank tags ("[rank0]:", "[default0]:").
_PREFIX = re.compile(r"^(?:[DIWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ?|\[(?:rank|default)\d+\]: ?)+")

NOISE: tuple[tuple[str, re.Pattern[str]], ...] = (
    # torchrun with several processes per node, each message line behind its own prefix
    ("torchrun OMP_NUM_THREADS banner", re.compile(r"^Setting OMP_NUM_THREADS environment variable for each process")),
    ("a banner's rule of asterisks", re.compile(r"^\*{10,}\s*$")),
    ("an empty log message (the first line of a multi-line one)", re.compile(r"^\s*$")),
    # tqdm bars of transformers and huggingface_hub: "\rLoading weights: 100%|####| 24/24 [00:00<00:00, ...]"
    ("a model-loading progress bar", re.compile(r"^(?:Loading (?:weights|checkpoint shards)|Fetching \d+ files"
                                                r"|Downloading)\b.*\d+%\|")),
)


def noise(line: str) -> str | None:
    """Which kind of noise ``line`` is (a NOISE name), or None for a line the console shows. A line that is
    only a prefix is noise; an empty line a program printed is not."""
    stripped = _PREFIX.sub("", line)
    if stripped == line and not line.strip():
        return None
    for name, pattern in NOISE:
        if pattern.search(stripped.lstrip("\r")):
            return name
    return None
