"""The engine's own implementation of the plain decoder LMs (Llama, Mistral, Qwen2, Qwen3), loaded from their HF
checkpoint directories.

Why: importing transformers' model code (`transformers.modeling_utils` and the model's module) costs a server
1.4 CPU-seconds of its start, more than torch itself; and on a CPU a small model's step spends a fifth of its time
in that code's Python. These are the same operations in the same order on the same tensors: embedding, rotary
embedding, per layer RMSNorm, projections (with Qwen3's per-head norms), rotary function, transformers' own sdpa
attention function and the mask transformers builds for it, MLP, final norm, output layer. Parameters carry the HF
names, so weight updates, LoRA merges and checkpoints address them as before. The logits are transformers' bit for
bit (tests/test_plain_decoder.py checks them per architecture, prefill and decode, padded or not).

Only what reproduces exactly: the default rotary embedding, SiLU, full attention (no sliding window), no custom code,
no quantisation, safetensors files. Anything else is loaded by transformers (`plain_decoder_or_why` says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from slimecli.model.plain_arch import ARCHITECTURES, unsupported_raw


def rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm of these architectures, op for op (so rounded the same)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    out: torch.Tensor = norm.weight * h.to(dtype)
    return out


def linear(lin: Any, x: torch.Tensor) -> torch.Tensor:
    return functional.linear(x, lin.weight, lin.bias)


def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary function of these architectures in transformers (cos, sin: [batch, seq, head_dim])."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def layer_forward(layer: Any, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                  mask: torch.Tensor | None, cache: Any, attention: Any, rope_fn: Any = rotate) -> torch.Tensor:
    """One decoder layer of HF-named parts (self_attn.{q,k,v,o}_proj, optional q_norm/k_norm, mlp.{gate,up,down}_proj,
    the two RMSNorms): transformers' layer forward, op for op. `cache`: keys/values appended per layer_idx, or None."""
    a, m = layer.self_attn, layer.mlp
    shape = (*hidden.shape[:-1], -1, a.head_dim)
    x = rms_norm(layer.input_layernorm, hidden)
    q, k = linear(a.q_proj, x).view(shape), linear(a.k_proj, x).view(shape)
    if hasattr(a, "q_norm"):
        q, k = rms_norm(a.q_norm, q), rms_norm(a.k_norm, k)
    v = linear(a.v_proj, x).view(shape).transpose(1, 2)
    q, k = rope_fn(q.transpose(1, 2), k.transpose(1, 2), *rope)
    if cache is not None:
        k, v = cache.update(k, v, a.layer_idx)
    out, _ = attention(a, q, k, v, mask, dropout=0.0, scaling=a.scaling)
    hidden = hidden + linear(a.o_proj, out.reshape(*hidden.shape[:-1], -1).contiguous())
    x = rms_norm(layer.post_attention_layernorm, hidden)
    return hidden + linear(m.down_proj, m.act_fn(linear(m.gate_proj, x)) * linear(m.up_proj, x))


def causal_mask(padding: torch.Tensor | None, q_len: int, past: int, batch: int, device: torch.device
                ) -> torch.Tensor | None:
    """The boolean mask transformers' sdpa mask function gives these models (None where sdpa's own causal flag, or
    no mask, does the same): queries at positions past.., keys 0..past+q_len, `padding` [batch, keys] or None."""
    kv = past + q_len
    if padding is not None:
        padding = padding.to(device=device, dtype=torch.bool)
        if padding.shape[-1] < kv:
            padding = functional.pad(padding, (0, kv - padding.shape[-1]))
        padding = padding[:, :kv]
    if (q_len == 1 or kv == q_len) and (padding is None or bool(padding.all())):
        return None
    if past == 0 and (padding is None or (bool(padding[:, :q_len].all()) and bool((~padding[:, q_len:]).all()))):
        return None
    queries = torch.arange(q_len, device=device) + past
    mask = torch.arange(kv, device=device)[None, None, None, :] <= queries[None, None, :, None]
    if padding is not None:
        mask = mask & padding[:, None, None, :]
    return mask.expand(batch, -1, q_len, kv)


def decode_mask(pads: list[int], columns: int, device: torch.device) -> torch.Tensor | None:
    """The mask of a decode step (one query per row) over `columns` keys: none without padding, else True from each
    row's first real column on (what transformers' sdpa mask function gives a single query)."""
    if not any(pads):
        return None
    return (torch.arange(columns, device=device) >= torch.tensor(pads, device=device).unsqueeze(1))[:, None, None, :]


class Linear(nn.Linear):
    """Parameters made without their random init: it is overwritten by the checkpoint's tensors anyway, and on the
    meta device it costs the import of torch._dynamo (1 CPU-second)."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(self, x)


class Attention(nn.Module):
    is_causal = True

    def __init__(self, cfg: Any, layer_idx: int, biases: tuple[bool, bool], qk_norm: bool) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = head_dim(cfg)
        self.scaling = self.head_dim ** -0.5
        self.num_key_value_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        heads, kv_heads = cfg.num_attention_heads * self.head_dim, cfg.num_key_value_heads * self.head_dim
        self.q_proj = Linear(cfg.hidden_size, heads, bias=biases[0])
        self.k_proj = Linear(cfg.hidden_size, kv_heads, bias=biases[0])
        self.v_proj = Linear(cfg.hidden_size, kv_heads, bias=biases[0])
        self.o_proj = Linear(heads, cfg.hidden_size, bias=biases[1])
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, cfg: Any, bias: bool) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.act_fn = nn.SiLU()


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Any, layer_idx: int, arch: tuple[bool | str, bool | str, bool | str, bool]) -> None:
        super().__init__()
        qkv, o, mlp, qk_norm = (getattr(cfg, b, False) if isinstance(b, str) else b for b in arch)
        self.self_attn = Attention(cfg, layer_idx, (bool(qkv), bool(o)), bool(qk_norm))
        self.mlp = MLP(cfg, bool(mlp))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class RotaryEmbedding(nn.Module):
    """The default rotary embedding: transformers' inverse frequencies and cos/sin, op for op."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        dim = head_dim(cfg)
        # on the CPU even while the model is laid out on the meta device (a meta arange imports torch._dynamo)
        inv_freq = 1.0 / (rope_theta(cfg) ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)  # times 1.0 in transformers: exact


class Backbone(nn.Module):
    def __init__(self, cfg: Any, arch: tuple[bool | str, bool | str, bool | str, bool]) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, arch) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg)


@dataclass
class Output:
    logits: torch.Tensor


class PlainDecoderLM(nn.Module):
    """A causal LM of one of ARCHITECTURES; `config` and `generation_config` are transformers' own objects."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config: Any = cfg
        self.generation_config: Any = None  # the checkpoint's (plain_decoder_or_why)
        self.model = Backbone(cfg, ARCHITECTURES[cfg.model_type])
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.attention = sdpa_attention_forward

    def _run(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, cache: Any,
             keep: int = 0) -> torch.Tensor:
        hidden = self.model.embed_tokens(ids)
        rope = self.model.rotary_emb(hidden, pos)
        for layer in self.model.layers:
            hidden = layer_forward(layer, hidden, rope, mask, cache, self.attention)
        hidden = rms_norm(self.model.norm, hidden)
        logits: torch.Tensor = self.lm_head(hidden[:, -keep:, :] if keep else hidden)
        return logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None, use_cache: bool = True,
                logits_to_keep: int = 0) -> Output:
        """As the HF causal LM's forward: logits of the last `logits_to_keep` positions (0: all); keys and values
        appended to `past_key_values` (a transformers cache) when given."""
        cache = past_key_values if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        batch, q_len = input_ids.shape
        if position_ids is None:
            position_ids = (torch.arange(q_len, device=input_ids.device) + past).unsqueeze(0)
        mask = causal_mask(attention_mask, q_len, past, batch, input_ids.device)
        return Output(self._run(input_ids, position_ids, mask, cache, logits_to_keep))

    def step(self, ids: torch.Tensor, pos: torch.Tensor, pads: list[int], cache: Any) -> torch.Tensor:
        """One decode step (engine/decoder.py's contract): ids, pos [rows, 1]; pads: each row's leading padding
        columns in `cache`. Returns logits [rows, vocab]."""
        mask = decode_mask(pads, cache.get_seq_length() + 1, ids.device)
        with torch.inference_mode():
            return self._run(ids, pos, mask, cache, keep=1)[:, -1, :]


def head_dim(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def _rope_type(cfg: Any) -> str:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def _unsupported(cfg: Any) -> str:
    """Why this (parsed) config is not one the plain decoder reproduces exactly; "" when it is."""
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if _rope_type(cfg) != "default":
        return f"rope type {_rope_type(cfg)!r}"
    if getattr(cfg, "sliding_window", None) is not None or any(
            t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "sliding-window attention"
    return ""


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [path / "model.safetensors"] if (path / "model.safetensors").is_file() else []


def plain_decoder_or_why(path: str | Path, dtype: torch.dtype, device: str = "cpu"
                         ) -> tuple[PlainDecoderLM | None, str]:
    """The checkpoint at `path` as a PlainDecoderLM, or None and why transformers must load it instead."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoConfig, GenerationConfig

    path = Path(path)
    why = unsupported_raw(json.loads((path / "config.json").read_text()))
    if why:
        return None, why
    cfg = AutoConfig.from_pretrained(str(path))
    why = _unsupported(cfg)
    files = _tensor_files(path)
    if why or not files:
        return None, why or "no safetensors files"
    with torch.device("meta"):
        model = PlainDecoderLM(cfg)
    expected = {name: p for name, p in model.state_dict(keep_vars=True).items()
                if not (cfg.tie_word_embeddings and name == "lm_head.weight")}
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:  # names and shapes from the headers: a layout it refuses is not read twice
        with safe_open(str(file), framework="pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    if shapes.keys() != expected.keys():
        odd = sorted(shapes.keys() ^ expected.keys())
        return None, f"its tensors are not the plain layout ({', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''})"
    for name, shape in shapes.items():
        if shape != tuple(expected[name].shape):
            return None, f"{name} has shape {shape}, the config says {tuple(expected[name].shape)}"
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update((name, t.to(dtype)) for name, t in load_file(str(file), device=device).items()
                       if name in expected)
    model.load_state_dict(tensors, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb.to(device)
    cfg._attn_implementation = "sdpa"
    model.generation_config = (GenerationConfig.from_pretrained(str(path))
                               if (path / "generation_config.json").is_file() else GenerationConfig.from_model_config(cfg))
    return model.eval(), ""
