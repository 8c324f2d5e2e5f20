"""Which build of torch is installed, seen from its files: a GPU build's processes are not forked from one that
imported torch (CUDA does not survive a fork), and deciding must not import it."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def gpu_build() -> bool:
    """Whether the installed torch has CUDA or ROCm (seen from its files: importing it is what we decide on)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return any(lib.glob("libtorch_cuda*")) or any(lib.glob("libtorch_hip*")) or any(lib.glob("libc10_cuda*"))
