"""megatron-core distributed checkpoints of the megatron policy: every rank writes its own shards.

The format is megatron-core's ``torch_dist`` (PyTorch Distributed Checkpoint files plus megatron-core's
metadata), so a checkpoint saved at one TP/PP/DP layout loads at another. The write goes through torch's own
FileSystemWriter in the calling thread instead of megatron-core's forked writer processes: those hang where
ranks talk over gloo (CPU runs), and a training step waits for the save anyway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


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


OPTIMIZER_KIND = "optimizer_kind.json"


def write_optimizer_kind(directory: Path, distributed: bool) -> None:
    (directory / OPTIMIZER_KIND).write_text(json.dumps({"distributed_optimizer": distributed}))


def check_optimizer_kind(directory: Path, distributed: bool) -> None:
    """megatron-core stores the distributed optimizer's state (DP > 1) and the plain one's (DP = 1) in different
    shapes and loads neither into the other (a KeyError deep inside it): say so, naming the way out."""
    path = directory / OPTIMIZER_KIND
    if not path.is_file():
        return  # written before the kind was recorded
    saved = bool(json.loads(path.read_text()).get("distributed_optimizer"))
    if saved != distributed:
        def kind(d: bool) -> str:
            return "the distributed optimizer (data parallel > 1)" if d else "the plain optimizer (data parallel = 1)"

        raise ValueError(f"{directory} holds the optimizer state of {kind(saved)}, and this run uses "
                         f"{kind(distributed)}: megatron-core cannot load one into the other. Resume with a "
                         f"data-parallel size {'above' if saved else 'of'} 1 (trainer.nproc x cluster.nnodes / "
                         "(tensor x pipeline parallel size)); TP and PP may change.")


def prepare_optimizer_load(optimizer: Any) -> None:
    """Two gaps of megatron-core 0.16's distributed optimizer with torch's Adam (no Transformer Engine or apex:
    on CPU, and on GPUs without them), each of which stops a resume:

    - ``state_dict()`` reads Adam's step from every parameter's state, which torch's Adam creates at its first
      step: before any update it fails ``assert len(steps) == 1``. megatron-core's own dummy step (zero
      gradients) allocates that state; the checkpoint then overwrites it, and the weights it touched too.
    - loading the parameter state copies every key of the parameter's Adam state from the checkpoint's, which
      leaves "step" out (it is restored from the parameter groups first): ``KeyError: 'step'``. The step
      already set is passed along, so that copy keeps it.
    - that restored step is one tensor shared by every parameter's state, which torch's Adam increments in
      place once per parameter: the next update's bias correction would use step N+k for the k-th parameter
      (every weight off by about a quarter of the learning rate). Each parameter gets its own copy.
    """
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return  # fused Adam keeps its step in the parameter groups: neither gap
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if not hasattr(opt, "_set_main_param_and_optimizer_states") or not isinstance(inner, torch.optim.Adam):
            continue  # not megatron-core's DistributedOptimizer over torch's Adam (AdamW is a subclass)
        if not inner.state:
            opt._init_optimizer_states_with_dummy_values()
        if opt.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8 or getattr(opt, "_keeps_step", False):
            continue
        original = opt._set_main_param_and_optimizer_states

        def set_states(model_param: Any, tensors: dict[str, Any], opt: Any = opt, original: Any = original) -> Any:
            group_index, group_order = opt.model_param_group_index_map[model_param]
            main = opt.optimizer.param_groups[group_index]["params"][group_order]
            state = opt.optimizer.state.get(main)
            if state and "step" in state:
                state["step"] = state["step"].clone()  # one tensor for all: each update would add 1 per parameter
                if "step" not in tensors:
                    tensors = {**tensors, "step": state["step"].clone()}
            return original(model_param, tensors)

        opt._set_main_param_and_optimizer_states = set_states
        opt._keeps_step = True
