"""teacher.backend=megatron: the teacher's model body tensor-parallel through megatron-core.

The torch back-end replicates the decoder on every rank and shards only the output layer; here the whole
model is split the megatron-core way (column/row-parallel attention and MLP, a vocab-parallel output layer),
so a rank holds about 1/tp of the weights. megatron-core's output layer already yields this rank's slice of
the (padded) vocabulary, exactly the [N, V/tp] logits the vocab-parallel scoring in vocab_parallel.py takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from slimecli.model.megatron.build import GPTSpec, build_model, init_parallel
from slimecli.teacher import vocab_parallel as vp


@dataclass
class MegatronTeacherModel:
    module: Any  # this rank's GPTModel part (pipeline parallel size 1: the whole depth)
    shard: vp.VocabShard
    path: str
    softcap: float | None = None
    collective_forward: bool = True

    def local_logits(self, input_ids: list[int]) -> torch.Tensor:
        """[len-1, V/tp] logits of this rank's vocabulary slice for positions 0..len-2."""
        device = next(self.module.parameters()).device
        ids = torch.tensor([input_ids], dtype=torch.long, device=device)
        positions = torch.arange(ids.shape[1], device=device).unsqueeze(0)
        causal = torch.triu(torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool, device=device),
                            diagonal=1)
        logits: torch.Tensor = self.module(ids, positions, causal)  # [1, len, V/tp]
        return logits[0, :-1].float()


def load_megatron(path: str, dtype: str, device: torch.device, tp: int, tp_rank: int, seed: int,
                  trust_remote_code: bool = False) -> MegatronTeacherModel:
    """Build this rank's part of the model from an HF checkpoint (megatron-core's groups made on first use)."""
    from megatron.core import parallel_state as ps

    init_parallel(tp, 1, seed)
    if ps.get_tensor_model_parallel_world_size() != tp or ps.get_tensor_model_parallel_rank() != tp_rank:
        raise RuntimeError(f"megatron-core's tensor-parallel layout (rank {ps.get_tensor_model_parallel_rank()} of "
                           f"{ps.get_tensor_model_parallel_world_size()}) differs from the teacher's "
                           f"({tp_rank} of {tp})")
    module, arch, _ = build_model(GPTSpec(path, tp, 1, dtype, trust_remote_code))
    module.to(device).eval().requires_grad_(False)
    return MegatronTeacherModel(module, vp.VocabShard(arch.vocab_size, tp, tp_rank), path)
