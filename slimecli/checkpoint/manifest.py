"""Whether a checkpoint directory is whole: its manifest, written last before the COMPLETE marker.

manifest.json lists every file the checkpoint holds (whatever the back-end wrote: the model, the
optimizer state, with megatron every rank's shard of it, the scheduler, the RNG states, meta.json) with
its size and a SHA-256. Files up to FULL_HASH_BYTES are hashed whole. Bigger ones (the model and the
optimizer state of a real model, tens of GB) are hashed over SAMPLES evenly spaced blocks of SAMPLE_BYTES,
head and tail included, so that checking a checkpoint costs a few hundred MB of reads at most, not a
full pass over the disk at every save and resume; with the exact size and the safetensors header check
this catches missing, truncated, extended and overwritten files, but not a flipped bit inside an
unsampled block of a big file (the loader then fails and the previous checkpoint is used).

A checkpoint without a manifest (written before manifests existed) is loaded with a warning once its
required files are present and its safetensors header is sound.

Torch-free: the controller checks a run's checkpoints before it launches anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slimecli.checkpoint.layout import COMPLETE, MANIFEST, MODEL_FILE, REQUIRED, is_complete, step_dirs

log = logging.getLogger(__name__)

FULL_HASH_BYTES = 64 << 20
SAMPLE_BYTES = 1 << 20
SAMPLES = 16


class CheckpointDamaged(RuntimeError):
    """No checkpoint of the run can be used, though some exist; the message names each and why."""

    def __init__(self, damaged: list[tuple[Path, str]]):
        self.damaged = damaged
        listing = "; ".join(f"{path}: {problem}" for path, problem in damaged)
        super().__init__(f"no usable checkpoint: {listing} (delete the damaged checkpoint directories to start "
                         "the run over, or pick another run.dir)")


def digest(path: Path, size: int) -> str:
    """SHA-256 of the whole file, or of SAMPLES evenly spaced blocks when it is bigger than FULL_HASH_BYTES."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: f.read(SAMPLE_BYTES), b""):
                h.update(block)
            return h.hexdigest()
        step = (size - SAMPLE_BYTES) // (SAMPLES - 1)
        for i in range(SAMPLES):
            f.seek(i * step)
            h.update(f.read(SAMPLE_BYTES))
    return "sampled:" + h.hexdigest()


def write(directory: Path) -> None:
    """List every file of ``directory`` (but the marker and the manifest) in its manifest, fsynced."""
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if p.is_file() and rel not in (COMPLETE, MANIFEST):
            size = p.stat().st_size
            files[rel] = {"size": size, "sha256": digest(p, size)}
    with open(directory / MANIFEST, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a sound safetensors file (header readable, tensors exactly fill the file), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                return f"{path.name} is not a safetensors file (header length {n})"
            header = json.loads(f.read(n))
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        return f"{path.name} is not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return f"{path.name} is not a safetensors file"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{path.name} is not a safetensors file (bad tensor entries)"
    if 8 + n + end != size:
        return f"{path.name} has {size} bytes, its header describes {8 + n + end}"
    return None


def problem(path: Path, *, warn: Callable[[str], None] | None = None) -> str | None:
    """Why the complete checkpoint ``path`` cannot be used, or None when it is whole."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        missing = [name for name in REQUIRED if not (path / name).is_file()]
        if missing:
            return f"{missing[0]} is missing"
        (warn or log.warning)(f"checkpoint {path} has no {MANIFEST} (written by an older slimecli): "
                              "loading it without checking its files")
        return safetensors_problem(path / MODEL_FILE)
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        entries = [(str(name), int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST} is unreadable"
    for name, size, _ in entries:
        p = path / name
        try:
            actual = p.stat().st_size if p.is_file() else None
        except OSError:  # removed while looked at
            actual = None
        if actual is None:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, the manifest says {size}"
    for name, size, sha in entries:
        try:
            if digest(path / name, size) != sha:
                return f"{name} does not match its recorded SHA-256"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
    return safetensors_problem(path / MODEL_FILE) if (path / MODEL_FILE).is_file() else None


def sizes_match(path: Path) -> bool:
    """The cheap part of `problem` (marker, manifest, every size): used when pruning, which runs at every save."""
    if not is_complete(path):
        return False
    try:
        files = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["files"]
        return all((path / name).is_file() and (path / name).stat().st_size == int(entry["size"])
                   for name, entry in files.items())
    except FileNotFoundError:
        return all((path / name).is_file() for name in REQUIRED)  # no manifest: an older checkpoint
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def newest_usable(run_dir: str | Path, *, below: int | None = None,
                  warn: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint whose files check out (with a step below ``below``, if given).

    Each damaged one on the way is skipped with a warning naming it and the checkpoint used instead.
    None when the run has no complete checkpoint; CheckpointDamaged when it has some but none is usable.
    """
    say = warn or log.warning
    complete = [p for step, p in step_dirs(run_dir) if is_complete(p) and (below is None or step < below)]
    damaged: list[tuple[Path, str]] = []
    for path in reversed(complete):
        why = problem(path, warn=say)
        if why is None:
            if damaged:
                say(f"resuming from the previous complete checkpoint {path}")
            return path
        say(f"checkpoint {path} is damaged ({why}); skipped")
        damaged.append((path, why))
    if damaged:
        raise CheckpointDamaged(damaged)
    return None
