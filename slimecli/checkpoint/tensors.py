"""State dicts made fit for safetensors, which refuses tensors that share storage (a tied embedding and head).

A checkpoint, a weight export and a weight push each send every distinct tensor once and name the rest as
aliases of it.
"""

from __future__ import annotations

import torch


def dedupe_views(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Each distinct tensor once (a tied weight appears under two names) and {alias: first name}."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    # a view's identity: storage, offset, shape, stride, dtype
    seen: dict[tuple[int, int | torch.SymInt, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
    for name, value in state_dict.items():
        t = value.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t
    return tensors, aliases


def split_shared(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors for safetensors (which refuses shared storage) and {alias: first name} for the rest."""
    unique, aliases = dedupe_views(state_dict)
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, t in unique.items():
        t = t.to("cpu").contiguous()
        storage = t.untyped_storage().data_ptr()
        if t.numel() and storage in storages:  # another view of a storage already written: copy it
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    return tensors, aliases
