"""What every process slimecli starts gets in its environment, less its run directory: unbuffered output and
the allocator settings. Standard library only: the command line reads it before it composes a config."""

from __future__ import annotations

import os

# glibc hands a freed block of more than its mmap threshold back to the kernel (and trims a heap top over its
# trim threshold), so a CPU step's large temporaries (logits, their softmax, gradients) are faulted in afresh
# on every step: computing a [256, 4096] entropy took 10 ms, 2 ms with the blocks kept. Blocks up to 64 MiB
# stay in the process; larger ones (weights, big-vocabulary logits) are still mapped and unmapped.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}


def malloc_env() -> dict[str, str]:
    """The allocator settings, unless the environment sets the allocator itself (its own values, GLIBC_TUNABLES,
    or another malloc preloaded)."""
    if any(k in os.environ for k in (*MALLOC_ENV, "GLIBC_TUNABLES", "LD_PRELOAD")):
        return {}
    return dict(MALLOC_ENV)


def child_env() -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1", **malloc_env()}
