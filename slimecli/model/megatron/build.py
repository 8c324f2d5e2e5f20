"""A megatron-core GPTModel built from a Hugging Face checkpoint, its weights in and out (TP and PP aware).

Every rank builds its own part (its pipeline stage's layers, its tensor-parallel slices) with CPU
initialisation, then loads the HF weights converted (convert.py) and sliced for it. ``gather_hf_state`` is the
way back: TP slices all-gathered, PP stages sent to rank 0 tensor by tensor, converted to HF names. Shared by the trainer
(trainer=megatron) and the teacher server (teacher.backend=megatron).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slimecli.model.megatron.convert import Arch, arch_from_hf, hf_to_megatron, megatron_to_hf, shard, unshard

log = logging.getLogger("slimecli.megatron")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class GPTSpec:
    """What to build: the checkpoint and how it is split."""

    path: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "float32"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    sequence_parallel: bool = False  # activations outside attention/MLP split along the sequence over TP


def init_parallel(tensor_parallel_size: int, pipeline_parallel_size: int, seed: int) -> None:
    """megatron-core's parallel_state for TP x PP (x the rest of the world as DP).

    Once per process: a policy and a frozen reference share the groups. Applies the CPU shim where no GPU exists.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not torch.cuda.is_available():
        from slimecli.model.megatron import cpu

        cpu.apply()
    if ps.model_parallel_is_initialized():
        return
    if not dist.is_initialized():  # a world of one still needs a process group for megatron-core
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        from slimecli.net.ports import free_port

        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl", rank=0, world_size=1)
    world = dist.get_world_size()
    if world % (tensor_parallel_size * pipeline_parallel_size):
        raise ValueError(f"{world} ranks do not split into tensor parallel size {tensor_parallel_size} x "
                         f"pipeline parallel size {pipeline_parallel_size}")
    ps.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel_size,
                                 pipeline_model_parallel_size=pipeline_parallel_size)
    model_parallel_cuda_manual_seed(seed)


def transformer_config(arch: Arch, spec: GPTSpec) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = DTYPES[spec.dtype]
    recompute = spec.gradient_checkpointing
    return TransformerConfig(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size, num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads, kv_channels=arch.head_dim, ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=arch.rms_norm_eps, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm, tensor_model_parallel_size=spec.tensor_parallel_size,
        pipeline_model_parallel_size=spec.pipeline_parallel_size, sequence_parallel=spec.sequence_parallel,
        use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16, hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False,
        apply_rope_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, calculate_per_token_loss=True,
        recompute_granularity="full" if recompute else None, recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None)


def build_model(spec: GPTSpec) -> tuple[torch.nn.Module, Arch, Any]:
    """This rank's GPTModel part, with the HF checkpoint's weights loaded; (model, arch, TransformerConfig)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel
    from transformers import AutoConfig

    path = Path(spec.path)
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    arch = arch_from_hf(hf_config, spec.tensor_parallel_size)
    config = transformer_config(arch, spec)
    model = GPTModel(config, layer_specs(arch, config), vocab_size=arch.padded_vocab_size, max_sequence_length=arch.max_positions,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=arch.tied, position_embedding_type="rope",
                     rotary_base=int(arch.rope_theta))
    load_hf_state(model, read_hf(path), arch)
    return model, arch, config


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm, its weight marked the way megatron-core's fused norms mark theirs.

    With sequence parallelism each TP rank normalises its own slice of the sequence, so the weight's gradient
    is partial and megatron-core all-reduces the parameters marked ``sequence_parallel`` over TP (in
    finalize_model_grads). The local spec's torch norm refuses sequence parallelism for want of that mark;
    the fused norms that carry it need apex or Transformer Engine (GPU only).
    """

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]


def spec_choice(te_installed: bool, gpu: bool) -> tuple[str, str | None]:
    """Which megatron-core layer spec to build: ("transformer_engine", None) where Transformer Engine can run,
    else ("local", the warning to log). The local spec's attention is unfused: it materialises the s x s score
    tensor, so long RL sequences can run out of memory where Transformer Engine's fused attention would not."""
    if te_installed and gpu:
        return "transformer_engine", None
    if gpu:
        return "local", ("Transformer Engine is not installed: megatron-core runs its local spec (unfused attention "
                         "holds the full s x s scores; long sequences may run out of memory). Install "
                         "transformer-engine[pytorch] for fused attention and norms")
    return "local", "no GPU: megatron-core runs its local spec (Transformer Engine needs a GPU)"


# Transformer Engine fuses the pre-attention and pre-MLP norms into the next linear layer: their weights live
# there under other names. Loading and export speak the local spec's names.
TE_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
            "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}


def _local_spec_name(name: str) -> str:
    for te, local in TE_NAMES.items():
        if name.endswith("." + te):
            return name[:-len(te)] + local
    return name


def layer_specs(arch: Arch, config: Any) -> Any:
    """Transformer Engine's spec where it can run (spec_choice), else megatron-core's local spec; with sequence
    parallelism on the local spec, the norms above instead."""
    import importlib.util

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    kind, warning = spec_choice(importlib.util.find_spec("transformer_engine") is not None,
                                torch.cuda.is_available())
    if warning:
        log.warning(warning)
    if kind == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_norm)
    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    if not config.sequence_parallel:
        return spec
    layer = spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = SequenceParallelRMSNorm
    if arch.qk_norm:  # q/k norms see whole sequences; megatron-core all-reduces them over TP by name
        layer.self_attention.submodules.q_layernorm = SequenceParallelRMSNorm
        layer.self_attention.submodules.k_layernorm = SequenceParallelRMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config),
                                      layer_norm=SequenceParallelRMSNorm)


def read_hf(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights (model.path)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _layer_offset(arch: Arch) -> int:
    """The global index of this pipeline stage's first layer (layers split evenly over the stages)."""
    from megatron.core import parallel_state as ps

    stage: int = ps.get_pipeline_model_parallel_rank()
    return stage * (arch.num_layers // int(ps.get_pipeline_model_parallel_world_size()))


def _global_name(local: str, offset: int) -> str:
    """decoder.layers.<stage-local i>.x -> decoder.layers.<global i>.x, in the local spec's names"""
    local = _local_spec_name(local)
    if not local.startswith("decoder.layers."):
        return local
    index, rest = local[len("decoder.layers."):].split(".", 1)
    return f"decoder.layers.{int(index) + offset}.{rest}"


def _tp_dim(param: torch.Tensor) -> int | None:
    return int(getattr(param, "partition_dim", 0)) if getattr(param, "tensor_model_parallel", False) else None


def load_hf_state(model: torch.nn.Module, hf: dict[str, torch.Tensor], arch: Arch) -> None:
    """Load a whole HF state dict into this rank's part (its stage's layers, its TP slices)."""
    from megatron.core import parallel_state as ps

    whole = hf_to_megatron(hf, arch)
    if arch.tied:  # the last stage keeps its own copy of the tied embedding as output_layer (PP > 1)
        whole["output_layer.weight"] = whole["embedding.word_embeddings.weight"]
    rank, size, offset = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), _layer_offset(arch)
    with torch.no_grad():
        for name, param in model.named_parameters():
            source = whole.get(_global_name(name, offset))
            if source is None:
                raise KeyError(f"no weight for megatron-core parameter {name} in the converted checkpoint")
            part = shard(name, source, _tp_dim(param), rank, size)
            if part.shape != param.shape:
                raise ValueError(f"{name}: converted slice {tuple(part.shape)} != parameter {tuple(param.shape)}")
            param.copy_(part.to(param.dtype))


def _whole_tensors(model: torch.nn.Module, arch: Arch) -> Iterator[tuple[str, torch.Tensor]]:
    """This stage's parameters one at a time, each whole (its TP slices all-gathered), in global names.

    Every rank of the TP group must iterate in step (each all-gather is a collective of the group)."""
    from megatron.core import parallel_state as ps

    tp_group = ps.get_tensor_model_parallel_group()
    tp_size = ps.get_tensor_model_parallel_world_size()
    offset = _layer_offset(arch)
    tied_copy = arch.tied and not ps.is_pipeline_first_stage()  # the first stage sends the embedding itself
    for name, param in model.named_parameters():
        if tied_copy and name == "output_layer.weight":
            continue
        local = param.detach().contiguous()
        parts = [local]
        if tp_size > 1 and _tp_dim(param) is not None:
            parts = [torch.empty_like(local) for _ in range(tp_size)]
            dist.all_gather(parts, local, group=tp_group)
        yield _global_name(name, offset), unshard(name, parts, _tp_dim(param))


def _whole_shape(param: torch.Tensor, tp_size: int) -> list[int]:
    shape = list(param.shape)
    dim = _tp_dim(param)
    if dim is not None and tp_size > 1:
        shape[dim] *= tp_size
    return shape


def gather_hf_state(model: torch.nn.Module, arch: Arch, is_main: bool) -> dict[str, torch.Tensor] | None:
    """The whole model in HF names on global rank 0's CPU (None elsewhere); every rank must call it.

    Tensor by tensor, never a stage as one object (which under NCCL costs rank 0 the largest stage times the
    world size in device memory): the first replica all-gathers each parameter's TP slices, and the first rank
    of each later pipeline stage sends its whole parameters to rank 0 one at a time (send/recv), after a
    gather of their names, shapes and dtypes. The largest message is one whole parameter. Other data-parallel
    replicas hold the same weights and only take part in that small gather.
    """
    from megatron.core import parallel_state as ps

    first_replica = ps.get_data_parallel_rank() == 0
    tp_rank, tp_size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    speaks = first_replica and tp_rank == 0
    meta: list[tuple[str, list[int], torch.dtype]] | None = None
    if speaks:
        offset = _layer_offset(arch)
        tied_copy = arch.tied and not ps.is_pipeline_first_stage()
        meta = [(_global_name(n, offset), _whole_shape(p, tp_size), p.dtype) for n, p in model.named_parameters()
                if not (tied_copy and n == "output_layer.weight")]
    rank = dist.get_rank()
    metas: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(meta, metas, dst=0)  # names and shapes only: a few bytes per parameter
    whole: dict[str, torch.Tensor] = {}
    if first_replica:
        for name, tensor in _whole_tensors(model, arch):
            if rank == 0:
                whole[name] = tensor.cpu()
            elif speaks:
                dist.send(tensor.contiguous(), dst=0)
    if rank == 0 and metas is not None:
        device = next(model.parameters()).device
        for src, stage in enumerate(metas):
            if src == 0 or not stage:
                continue
            for name, shape, dtype in stage:
                buffer = torch.empty(shape, dtype=dtype, device=device)
                dist.recv(buffer, src=src)
                whole.setdefault(name, buffer.cpu())
    if not is_main or rank != 0:
        return None
    return megatron_to_hf(whole, arch)
