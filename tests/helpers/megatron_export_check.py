"""Run under torchrun (gloo): trainer=megatron's weight export, measured message by message.

    torchrun --nproc-per-node TPxPP tests/helpers/megatron_export_check.py OUT MODEL_DIR TP PP

Every collective and point-to-point call of torch.distributed is wrapped to record the bytes of each tensor it
moves. Rank 0 writes OUT/export.json: whether the export equals the earlier whole-stage path (kept below as the
reference) and the checkpoint it was built from, the largest message of each path and the largest parameter.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
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


def main() -> int:
    from slimecli.model.megatron.build import GPTSpec, build_model, gather_hf_state, init_parallel, read_hf
    from slimecli.train import dist as slime_dist

    out, model_dir, tp, pp = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    info = slime_dist.init("gloo")
    init_parallel(tp, pp, seed=0)
    model, arch, _ = build_model(GPTSpec(model_dir, tp, pp))
    biggest_param = max(p.numel() * p.element_size() * tp for p in model.parameters())
    record_messages()
    largest[0] = 0
    new = gather_hf_state(model, arch, info.is_main)
    new_largest = largest[0]
    largest[0] = 0
    old = whole_stage_reference(model, arch)
    old_largest = largest[0]
    if info.rank == 0:
        assert new is not None and old is not None
        checkpoint = read_hf(Path(model_dir))
        result = {
            "names": sorted(new), "old_names": sorted(old),
            "equal_old": all(torch.equal(new[k], old[k]) for k in old if k in new),
            "equal_checkpoint": all(torch.equal(new[k], checkpoint[k].to(new[k].dtype)) for k in new),
            "largest_message": new_largest, "old_largest_message": old_largest,
            "largest_parameter": biggest_param, "total": sum(t.numel() * t.element_size() for t in new.values()),
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / "export.json").write_text(json.dumps(result))
    slime_dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
