"""How trainer rank 0 hands new weights to the engines: ``trainer.weight_sync=disk|shared_memory|nccl``, one
module per kind (base.py: what they share).

- ``disk``: an HF checkpoint directory under RUN/weights, then ``/update_weights_from_disk`` (any engine).
- ``shared_memory``: the state dict copied into one tmpfs segment that co-located embedded engines copy
  from (``/update_weights_from_shared_memory``); nothing is serialised, nothing reaches a disk.
- ``nccl``: SGLang's weight-update group; every tensor is broadcast from rank 0 to every engine rank, in
  buckets of ``trainer.weight_sync_bucket_mb``. NCCL when the trainer has a GPU; gloo otherwise (the same
  protocol, which is how it is tested on a CPU).

Each engine sees pause -> flush -> update -> continue, whichever way the tensors travel.

With trainer.lora the state pushed is the adapter alone (peft's names): ``disk`` writes a peft adapter directory
that each engine loads with SGLang's ``/load_lora_adapter`` as ``policy-v<N>`` (generations then name it), and
``shared_memory`` carries the adapter's tensors, which the embedded engine merges into its kept base weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.train.weight_sync.base import Runner, WeightSync


def make_weight_sync(cfg: SlimeConfig, run_dir: Path, engines: list[Any], run: Runner,
                     policy: torch.nn.Module | None = None) -> WeightSync:
    """``policy``: rank 0's (unsharded) model, which shared_memory may keep in the segment itself."""
    kind = cfg.trainer.weight_sync
    lora = cfg.trainer.lora.enabled
    if kind == "disk" and lora:
        from slimecli.train.weight_sync.adapter_disk import AdapterDiskSync

        return AdapterDiskSync(cfg, run_dir, engines, run)
    if kind == "disk":
        from slimecli.train.weight_sync.disk import DiskSync

        return DiskSync(cfg, run_dir, engines, run)
    if kind == "shared_memory":
        from slimecli.train.weight_sync.shared_memory import SharedMemorySync

        if lora:
            from slimecli.train.lora import wire_config

            return SharedMemorySync(engines, run, cfg.model.dtype, None, lora_config=wire_config(cfg))
        return SharedMemorySync(engines, run, cfg.model.dtype, policy)
    if kind == "nccl":
        from slimecli.train.weight_sync.group import GroupSync

        return GroupSync(engines, run, bucket_bytes=cfg.trainer.weight_sync_bucket_mb << 20,
                         timeout_s=cfg.rollout.request_timeout_s)
    raise ValueError(f"trainer.weight_sync: unknown kind {kind!r}")  # the schema admits only the three
