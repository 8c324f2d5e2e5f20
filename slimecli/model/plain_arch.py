"""The plain decoder LMs (Llama, Mistral, Qwen2, Qwen3) as their config.json describes them, without torch.

model/plain_decoder.py implements them; the controller reads their module names from here (launch/lora_checks.py),
so checking trainer.lora's targets against a model.path of these costs no import of torch or of transformers' model
code (4 CPU-seconds of a command that has to build the model on the meta device to list its modules).
"""

from __future__ import annotations

from typing import Any

# model_type -> (q/k/v bias, o bias, MLP bias, per-head q/k norms), each bias either a constant or a config field
ARCHITECTURES: dict[str, tuple[bool | str, bool | str, bool | str, bool]] = {
    "llama": ("attention_bias", "attention_bias", "mlp_bias", False),
    "mistral": (False, False, False, False),
    "qwen2": (True, False, False, False),
    "qwen3": ("attention_bias", "attention_bias", False, True),
}
CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}


def unsupported_raw(raw: dict[str, Any]) -> str:
    """Why this config.json is not a plain decoder's (another architecture, custom code, quantised layers); "" when
    it may be one (model/plain_decoder.py then checks the parsed config further)."""
    if raw.get("model_type") not in ARCHITECTURES:
        return f"model_type {raw.get('model_type')!r} (plain decoders: {', '.join(sorted(ARCHITECTURES))})"
    for key in ("auto_map", "quantization_config"):
        if raw.get(key):
            return f"its config has {key}"
    return ""


def module_kinds(config: dict[str, Any]) -> dict[str, str] | None:
    """Every module of the causal LM a config.json describes, by dotted name, with its class name as transformers
    builds it ("Linear" for every linear layer); None where this is not known without transformers (another
    architecture, custom code, quantised layers, another activation)."""
    if (not isinstance(config, dict) or unsupported_raw(config) or config.get("hidden_act", "silu") != "silu"
            or not isinstance(config.get("num_hidden_layers"), int)):
        return None
    kind = config["model_type"]
    arch = CLASS_PREFIX[kind]
    norm = f"{arch}RMSNorm"
    out = {"model": f"{arch}Model", "model.embed_tokens": "Embedding", "model.layers": "ModuleList"}
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        out[layer], out[f"{layer}.self_attn"] = f"{arch}DecoderLayer", f"{arch}Attention"
        out.update({f"{layer}.self_attn.{p}_proj": "Linear" for p in "qkvo"})
        if ARCHITECTURES[kind][3]:
            out[f"{layer}.self_attn.q_norm"] = out[f"{layer}.self_attn.k_norm"] = norm
        out[f"{layer}.mlp"] = f"{arch}MLP"
        out.update({f"{layer}.mlp.{p}_proj": "Linear" for p in ("gate", "up", "down")})
        out[f"{layer}.mlp.act_fn"] = "SiLUActivation"
        out[f"{layer}.input_layernorm"] = out[f"{layer}.post_attention_layernorm"] = norm
    out.update({"model.norm": norm, "model.rotary_emb": f"{arch}RotaryEmbedding", "lm_head": "Linear"})
    return out
