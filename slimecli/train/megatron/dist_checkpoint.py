"""megatron-core distributed checkpoints of the megatron policy: every rank writes its own shards.

The format is megatron-core's ``torch_dist`` (PyTorch Distributed Checkpoint files plus megatron-core's
metadata), so a checkpoint saved at one TP/PP/DP layout loads at another. The write goes through torch's own
FileSystemWriter in the calling thread instead of megatron-core's forked writer processes: those hang where
ranks talk over gloo (CPU runs), and a training step waits for the save anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_strategy() -> Any:
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )

    class SyncTorchDistSave(TorchDistSaveShardedStrategy):  # type: ignore[misc]
        def save(self, sharded_state_dict: Any, checkpoint_dir: str | Path) -> None:
            state, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, self.keep_only_main_replica)
            dcp.save(mcore_to_pyt_state_dict(state, False), storage_writer=dcp.FileSystemWriter(str(checkpoint_dir)),
                     planner=MCoreSavePlanner(dedup_replicated_tensors=not self.keep_only_main_replica,
                                              flatten_state_dict=False))

    return SyncTorchDistSave("torch_dist", 1)


def save(state: Any, directory: Path) -> None:
    from megatron.core import dist_checkpointing

    dist_checkpointing.save(state, str(directory), sharded_strategy=save_strategy())


def load(template: Any, directory: Path) -> Any:
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load(template, str(directory))
