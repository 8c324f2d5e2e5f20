"""Create the tiny model: a real Qwen3-architecture HF checkpoint directory, deterministic from a seed.

Nothing is downloaded: the tokenizer is trained here (see tokenizer.py) and the weights are drawn from a
seeded generator in a fixed (sorted) parameter order, so the same arguments give byte-identical safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slimecli.model.tokenizer import DEFAULT_VOCAB_SIZE, ENDOFTEXT, IM_END, build_tokenizer, save_tokenizer

# Bump when the files this module writes change, so cached tiny models are rebuilt.
TINY_FORMAT_VERSION = 1
INIT_STD = 0.02


def tiny_config(*, vocab_size: int, eos_id: int, pad_id: int, hidden_size: int, num_layers: int, num_heads: int,
                num_kv_heads: int, intermediate_size: int, max_position_embeddings: int) -> dict[str, Any]:
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} is not a multiple of num_heads={num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": num_layers,
        "tie_word_embeddings": True,
        "initializer_range": INIT_STD,
        "use_cache": True,
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }


def _init_weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """The parameters' names and shapes come from the engine's own model of the architecture (the same HF names and
    shapes, which its loader checks): transformers' Qwen3 model code would cost 1.3 s of imports here."""
    import torch
    from transformers import AutoConfig

    from slimecli.model.plain_decoder import PlainDecoderLM

    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in PlainDecoderLM(hf_config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        if config["tie_word_embeddings"] and name == "lm_head.weight":
            continue
        shape = shapes[name]
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            tensors[name] = torch.randn(shape, generator=gen) * INIT_STD
    return tensors


def create_tiny_model(path: str | Path, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                      num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                      max_position_embeddings: int = 65536, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """Write config.json, generation_config.json, model.safetensors and the tokenizer files into `path`."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    ids = save_tokenizer(tok, out)
    n_vocab = -(-tok.get_vocab_size() // 64) * 64  # round up: the embedding may be larger than the tokenizer
    config = tiny_config(vocab_size=n_vocab, eos_id=ids[IM_END], pad_id=ids[ENDOFTEXT], hidden_size=hidden_size,
                         num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings)
    save_file(_init_weights(config, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": ids[ENDOFTEXT], "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
                  "pad_token_id": ids[ENDOFTEXT], "do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "slimecli_tiny.json").write_text(json.dumps(
        {"format_version": TINY_FORMAT_VERSION, "seed": seed}, indent=2) + "\n")
    return out
