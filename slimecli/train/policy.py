"""The policy model on a trainer rank: loading, wrapping in DDP, and response log-probs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from slimecli.config.schema import SlimeConfig
from slimecli.train.batch import PackedBatch
from slimecli.train.dist import DistInfo

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(cfg: SlimeConfig, info: DistInfo, trainable: bool = True) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=DTYPES[cfg.model.dtype],
                                                 trust_remote_code=cfg.model.trust_remote_code,
                                                 attn_implementation="sdpa")
    model.to(info.device)
    if not trainable:
        model.eval().requires_grad_(False)
        return model
    if cfg.trainer.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    if info.world_size > 1:
        ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def response_logits(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Logits [B, R, V] of the positions that predict each response token."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits
    index = batch.logit_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return torch.gather(logits, 1, index).float()


@contextmanager
def no_sync_unless(model: torch.nn.Module, last: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce on all but the last micro-batch of an accumulation."""
    ctx = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else nullcontext()
    with ctx:
        yield
