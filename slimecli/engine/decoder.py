"""The decode step (one new token per row) through the model's own modules, without its outer `forward`.

Why: on a CPU a small model's decode step spends a fifth of its time or more in the outer forwards of
transformers (keyword plumbing, output capture, a causal mask rebuilt from a 2-D mask) rather than in matmuls.
This runs the same modules on the same tensors: the embedding, the rotary embedding, every decoder layer (its own
forward, so its attention, norms and MLP are the model's), the final norm and the output layer. The attention mask
is the one the sdpa mask function builds for a single query: none without padding, else True from each row's
first real column on. The logits are the model's own bit for bit (tests/test_engine_units.py checks them per
architecture).

Only plain decoders whose outer forward adds nothing to that (no scaled embeddings, soft-capped or scaled logits,
sliding windows) take this path; anything else decodes through the full forward.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

# Architectures whose causal-LM forward is exactly: embed, rotary, layers, norm, lm_head.
PLAIN_DECODERS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class Decoder:
    """Decode steps of one served model (rebuilt whenever the runner gets a new model object)."""

    def __init__(self, model: Any) -> None:
        base = model.model
        self.embed, self.rotary, self.norm, self.head = base.embed_tokens, base.rotary_emb, base.norm, model.lm_head
        self.layers = list(base.layers)
        params = inspect.signature(self.layers[0].forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    @staticmethod
    def of(model: Any) -> Decoder | None:
        """The decoder of `model`, or None where only its full forward is known to be right."""
        cfg = model.config.get_text_config()
        base = getattr(model, "model", None)
        if (cfg.model_type not in PLAIN_DECODERS or cfg._attn_implementation != "sdpa"
                or getattr(cfg, "sliding_window", None) is not None
                or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ())
                or base is None or not hasattr(model, "lm_head")
                or not all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "norm", "layers"))):
            return None
        params = inspect.signature(base.layers[0].forward).parameters
        if "position_embeddings" not in params or not ({"cache", "past_key_values"} & params.keys()):
            return None
        return Decoder(model)

    def step(self, ids: torch.Tensor, pos: torch.Tensor, pads: list[int], cache: Any) -> torch.Tensor:
        """ids, pos: [rows, 1]; pads: each row's leading padding columns in `cache`. Returns logits [rows, vocab]."""
        mask = None
        if any(pads):
            columns = torch.arange(cache.get_seq_length() + 1, device=ids.device)
            mask = (columns >= torch.tensor(pads, device=ids.device).unsqueeze(1))[:, None, None, :]
        with torch.inference_mode():
            hidden = self.embed(ids)
            rope = self.rotary(hidden, pos)
            kw = {self.cache_kw: cache}
            for layer in self.layers:
                hidden = layer(hidden, attention_mask=mask, position_ids=pos, position_embeddings=rope,
                               use_cache=True, **kw)
                if isinstance(hidden, tuple):  # transformers before 5 returns (hidden_states, ...)
                    hidden = hidden[0]
            logits: torch.Tensor = self.head(self.norm(hidden))
        return logits[:, -1, :]
