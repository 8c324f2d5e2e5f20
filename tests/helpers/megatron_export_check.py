"""trainer=megatron's weight export, measured message by message, inside a megatron_check.py run (torchrun,
gloo; its ``export`` argument): every collective and point-to-point call of torch.distributed is wrapped to
record the bytes of each tensor it moves. ``measure_export`` returns, on rank 0, whether the export equals the
earlier whole-stage path (kept below as the reference), the largest message of each path and the largest
parameter.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

CALLS = ("send", "recv", "isend", "irecv", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
         "all_reduce", "reduce_scatter", "all_to_all")
largest = [0]


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return max((_bytes(v) for v in value), default=0)
    return 0


def _recording(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        largest[0] = max([largest[0], *(_bytes(a) for a in args), *(_bytes(v) for v in kwargs.values())])
        return fn(*args, **kwargs)

    return call


def record_messages() -> None:
    """Both names of each call (gather_object calls c10d's gather and all_gather from inside c10d)."""
    for name in CALLS:
        wrapped = _recording(getattr(c10d, name))
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)


def whole_stage_reference(model: torch.nn.Module, arch: Any) -> dict[str, torch.Tensor] | None:
    """The earlier export: each stage's whole state dict gathered to rank 0 as one object."""
    from megatron.core import parallel_state as ps

    from slimecli.model.megatron.build import _global_name, _layer_offset, _tp_dim
    from slimecli.model.megatron.convert import megatron_to_hf, unshard

    tp_size = ps.get_tensor_model_parallel_world_size()
    stage: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        local = param.detach().contiguous()
        parts = [local]
        if tp_size > 1 and _tp_dim(param) is not None:
            parts = [torch.empty_like(local) for _ in range(tp_size)]
            dist.all_gather(parts, local, group=ps.get_tensor_model_parallel_group())
        stage[_global_name(name, _layer_offset(arch))] = unshard(name, parts, _tp_dim(param))
    speaks = ps.get_data_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0
    stages: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(stage if speaks else None, stages, dst=0)
    if stages is None:
        return None
    whole: dict[str, torch.Tensor] = {}
    for part in stages:
        for name, tensor in (part or {}).items():
            whole.setdefault(name, tensor)
    return megatron_to_hf(whole, arch)


def measure_export(policy: Any, is_main: bool) -> dict[str, Any] | None:
    """The export (gather_hf_state) and the whole-stage reference, each with its largest message."""
    from megatron.core import parallel_state as ps

    from slimecli.model.megatron.build import gather_hf_state

    tp = ps.get_tensor_model_parallel_world_size()
    biggest_param = max(p.numel() * p.element_size() * tp for p in policy.module.parameters())
    record_messages()
    largest[0] = 0
    new = gather_hf_state(policy.module, policy.arch, is_main)
    new_largest = largest[0]
    largest[0] = 0
    old = whole_stage_reference(policy.module, policy.arch)
    if new is None or old is None:
        return None
    return {"names": sorted(new), "old_names": sorted(old),
            "equal_old": all(torch.equal(new[k], old[k]) for k in old if k in new),
            "largest_message": new_largest, "old_largest_message": largest[0], "largest_parameter": biggest_param,
            "total": sum(t.numel() * t.element_size() for t in new.values())}
