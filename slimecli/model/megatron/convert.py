"""Hugging Face <-> megatron-core weights for the Qwen3 / Qwen2 / Llama family, whole and tensor-parallel.

megatron-core ships no converter (and megatron-bridge needs Transformer Engine), so the mapping is here:

    model.embed_tokens                    embedding.word_embeddings (vocab padded to a multiple of TP)
    layers.i.input_layernorm              decoder.layers.i.input_layernorm
    layers.i.self_attn.{q,k,v}_proj       decoder.layers.i.self_attention.linear_qkv  (per query group: q heads, k, v)
    layers.i.self_attn.{q,k}_norm         decoder.layers.i.self_attention.{q,k}_layernorm
    layers.i.self_attn.o_proj             decoder.layers.i.self_attention.linear_proj
    layers.i.post_attention_layernorm     decoder.layers.i.pre_mlp_layernorm
    layers.i.mlp.{gate,up}_proj           decoder.layers.i.mlp.linear_fc1  ([gate; up])
    layers.i.mlp.down_proj                decoder.layers.i.mlp.linear_fc2
    model.norm                            decoder.final_layernorm
    lm_head                               output_layer (absent when the embeddings are tied)

Tensor-parallel shards: column-parallel weights split on dim 0 (fc1 splits gate and up separately, so each
rank keeps [gate_r; up_r]; qkv is grouped per query group, so a plain split keeps whole groups), row-parallel
ones on dim 1. Shards are made contiguous: gloo collectives of non-contiguous CPU views send wrong elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from slimecli.config.groups.trainer import MEGATRON_ARCHITECTURES as HF_ARCHITECTURES


@dataclass(frozen=True)
class Arch:
    """The shape facts the conversion and the megatron-core model need, read from an HF config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    max_positions: int


def arch_from_hf(config: Any, tensor_parallel_size: int = 1) -> Arch:
    """An Arch from a transformers config; a family this converter does not know is a ValueError naming it."""
    names = list(getattr(config, "architectures", None) or [])
    if not any(n in HF_ARCHITECTURES for n in names):
        raise ValueError(f"trainer=megatron converts {', '.join(HF_ARCHITECTURES)} checkpoints; "
                         f"this one is {names or config.model_type}")
    rope_scaling = getattr(config, "rope_scaling", None)
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (None, "default"):
        raise ValueError(f"trainer=megatron does not convert rope_scaling={rope_scaling} yet")
    # megatron-core's add_qkv_bias covers q/k/v only: an o_proj or MLP bias would be dropped without a word
    o_proj_bias = bool(getattr(config, "attention_bias", False)) and "Qwen2ForCausalLM" not in names
    if o_proj_bias or getattr(config, "mlp_bias", False):
        raise ValueError("trainer=megatron does not convert o_proj or MLP biases (attention_bias/mlp_bias=true) yet")
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    vocab = config.vocab_size
    rope_theta = getattr(config, "rope_theta", None)
    if rope_theta is None:  # transformers 5 keeps it under rope_parameters
        rope_theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return Arch(
        num_layers=config.num_hidden_layers, hidden_size=config.hidden_size, num_heads=heads, num_kv_heads=kv,
        head_dim=head_dim, ffn_hidden_size=config.intermediate_size, vocab_size=vocab,
        padded_vocab_size=-(-vocab // tensor_parallel_size) * tensor_parallel_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=bool(getattr(config, "attention_bias", False)) or "Qwen2ForCausalLM" in names,
        qk_norm="Qwen3ForCausalLM" in names, rms_norm_eps=config.rms_norm_eps, rope_theta=float(rope_theta),
        max_positions=config.max_position_embeddings)


# ---- whole (unsharded) state dicts -------------------------------------------------------------------------
def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if rows > t.shape[0] else t


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Arch) -> torch.Tensor:
    """[q; k; v] (HF) -> per query group [q heads of the group, k, v] (megatron-core)."""
    g, per, d = arch.num_kv_heads, arch.num_heads // arch.num_kv_heads, arch.head_dim
    rest = q.shape[1:]
    grouped = torch.cat([q.reshape(g, per * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return grouped.reshape(g * (per + 2) * d, *rest)


def _split_qkv(qkv: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, per, d = arch.num_kv_heads, arch.num_heads // arch.num_kv_heads, arch.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *rest)
    q, k, v = grouped[:, :per * d], grouped[:, per * d:per * d + d], grouped[:, per * d + d:]
    return (q.reshape(g * per * d, *rest).contiguous(), k.reshape(g * d, *rest).contiguous(),
            v.reshape(g * d, *rest).contiguous())


def hf_to_megatron(hf: dict[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """A whole HF state dict (``model.`` prefixed) in megatron-core names and layouts (vocab padded)."""
    out = {"embedding.word_embeddings.weight": _pad_rows(hf["model.embed_tokens.weight"], arch.padded_vocab_size),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not arch.tied:
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], arch.padded_vocab_size)
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "self_attention.linear_qkv.weight"] = _qkv(hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"],
                                                            hf[attn + "v_proj.weight"], arch)
        if arch.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _qkv(hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"],
                                                              hf[attn + "v_proj.bias"], arch)
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
    return out


def megatron_to_hf(meg: dict[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """The inverse of hf_to_megatron: HF names and layouts, vocab padding removed."""
    embed = meg["embedding.word_embeddings.weight"][:arch.vocab_size]
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": meg["decoder.final_layernorm.weight"]}
    out["lm_head.weight"] = embed if arch.tied else meg["output_layer.weight"][:arch.vocab_size]
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = h + "self_attn."
        out[h + "input_layernorm.weight"] = meg[m + "input_layernorm.weight"]
        q, k, v = _split_qkv(meg[m + "self_attention.linear_qkv.weight"], arch)
        out.update({attn + "q_proj.weight": q, attn + "k_proj.weight": k, attn + "v_proj.weight": v})
        if arch.qkv_bias:
            qb, kb, vb = _split_qkv(meg[m + "self_attention.linear_qkv.bias"], arch)
            out.update({attn + "q_proj.bias": qb, attn + "k_proj.bias": kb, attn + "v_proj.bias": vb})
        if arch.qk_norm:
            out[attn + "q_norm.weight"] = meg[m + "self_attention.q_layernorm.weight"]
            out[attn + "k_norm.weight"] = meg[m + "self_attention.k_layernorm.weight"]
        out[attn + "o_proj.weight"] = meg[m + "self_attention.linear_proj.weight"]
        out[h + "post_attention_layernorm.weight"] = meg[m + "pre_mlp_layernorm.weight"]
        gate, up = meg[m + "mlp.linear_fc1.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
        out[h + "mlp.down_proj.weight"] = meg[m + "mlp.linear_fc2.weight"]
    return out


# ---- tensor-parallel shards --------------------------------------------------------------------------------
def _is_glu(name: str) -> bool:
    return name.endswith("mlp.linear_fc1.weight") or name.endswith("mlp.linear_fc1.bias")


def shard(name: str, whole: torch.Tensor, partition_dim: int | None, rank: int, size: int) -> torch.Tensor:
    """This TP rank's part of a whole megatron-core tensor; ``partition_dim`` None means replicated."""
    if partition_dim is None or size == 1:
        return whole.clone()
    if _is_glu(name):  # [gate; up]: each rank holds its slice of both halves
        return torch.cat([half.chunk(size, dim=0)[rank] for half in whole.chunk(2, dim=0)]).contiguous()
    return whole.chunk(size, dim=partition_dim)[rank].contiguous()


def unshard(name: str, parts: list[torch.Tensor], partition_dim: int | None) -> torch.Tensor:
    """The whole tensor from every TP rank's shard, in rank order (the inverse of ``shard``)."""
    if partition_dim is None or len(parts) == 1:
        return parts[0]
    if _is_glu(name):
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    return torch.cat(parts, dim=partition_dim)
