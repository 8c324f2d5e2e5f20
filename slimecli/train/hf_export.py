"""Write the trainer's weights as a Hugging Face checkpoint dir for an engine's update_weights_from_disk.

The dir gets the base model's config, generation config and tokenizer files (so the engine sees the same
architecture and tokenizer) plus a fresh model.safetensors. It is built in a temp dir and renamed into
place: an engine told to load it never sees a partial dir.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from slimecli.checkpoint.tensors import split_shared

WEIGHTS_DIR = "weights"
# Weight files of the base model that must not be copied next to the new weights.
_WEIGHT_FILE = re.compile(r"(\.safetensors|\.bin|\.pt|\.pth|\.ckpt|\.h5|\.msgpack|\.gguf)$|\.index\.json$")


def export_hf(state_dict: dict[str, torch.Tensor], base_model_dir: str | Path, out_dir: str | Path,
              dtype: torch.dtype | None = None) -> Path:
    """Write ``out_dir`` = base model's non-weight files + model.safetensors from ``state_dict``.

    Tensors sharing storage (tied embeddings) are written once under their first name, as HF does.
    ``dtype`` casts floating tensors (e.g. torch.bfloat16 to match the base config). Replaces an existing
    ``out_dir`` by rename. Returns the final path.
    """
    base, out = Path(base_model_dir), Path(out_dir)
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"{base} has no config.json: not a Hugging Face model dir")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for f in base.iterdir():
            if f.is_file() and not _WEIGHT_FILE.search(f.name):
                shutil.copy2(f, tmp / f.name)
        tensors, _aliases = split_shared(state_dict)
        if dtype is not None:
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        old = None
        if out.exists():
            old = out.parent / f".old-{out.name}-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_version(state_dict: dict[str, torch.Tensor], base_model_dir: str | Path, run_dir: str | Path,
                   version: int | str, keep: int | None = 2, dtype: torch.dtype | None = None) -> Path:
    """Export to RUN/weights/v<version>/ and delete all but the newest ``keep`` versions (None: leave that to
    a later prune_versions, off the caller's path: removing a directory costs milliseconds).

    One dir per version, so an engine still loading the previous one is not disturbed.
    """
    path = export_hf(state_dict, base_model_dir, Path(run_dir) / WEIGHTS_DIR / f"v{version}", dtype=dtype)
    if keep is not None:
        prune_versions(path, keep)
    return path


def prune_versions(newest: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` version dirs next to ``newest`` (itself always kept), and the
    leftovers of exports that other processes (earlier trainers) left half-written; this process's own may be
    in progress."""
    root = newest.parent
    versions = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("v")),
                      key=lambda p: (int(p.name[1:]) if p.name[1:].isdigit() else -1, p.stat().st_mtime_ns))
    for stale in versions[:-keep] if keep > 0 else []:
        if stale != newest:
            shutil.rmtree(stale, ignore_errors=True)
    for leftover in root.glob(".tmp-*"):
        if not leftover.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(leftover, ignore_errors=True)
