"""The decode step (one new token per row) on the model's own weights and modules, without its outer `forward`.

Why: on a CPU a small model's decode step spends a fifth of its time or more in the Python of transformers
(keyword plumbing, decorators, output capture, module calls, and a causal mask rebuilt from a 2-D mask every step)
rather than in matmuls and attention. This runs the same operations in the same order on the same tensors:
the embedding, the model's rotary embedding, then per layer its RMSNorms, projections, rotary function,
attention function (transformers' own sdpa one) and MLP, the final norm and the output layer. The attention
mask is the one the sdpa mask function builds for a single query: none without padding, else True from each
row's first real column on. The logits are the model's own bit for bit (tests/test_engine_units.py checks them
per architecture, step after step).

Plain decoders only (their causal-LM forward is exactly embed, rotary, layers, norm, lm_head: no scaled
embeddings, soft-capped or scaled logits, sliding windows). A layer made of other parts than transformers'
own (a LoRA wrapper, a quantised linear) runs through its own forward; any other model decodes through the
full forward.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from slimecli.model.plain_decoder import ARCHITECTURES, PlainDecoderLM, decode_mask, layer_forward

# Architectures whose causal-LM forward is exactly: embed, rotary, layers, norm, lm_head.
PLAIN_DECODERS = frozenset(ARCHITECTURES)
Rope = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _is_rms_norm(m: Any) -> bool:
    return type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon") and hasattr(m, "weight")


class _Layer:
    """One decoder layer's parts, when they are the plain ones this step reproduces."""

    def __init__(self, layer: Any, rope: Rope) -> None:
        self.layer, self.rope = layer, rope

    @staticmethod
    def plain(layer: Any) -> bool:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        norms = [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
        if attn is not None and hasattr(attn, "q_norm"):
            norms += [attn.q_norm, getattr(attn, "k_norm", None)]
        return (all(type(lin) is torch.nn.Linear for lin in linears) and all(_is_rms_norm(n) for n in norms)
                and all(hasattr(attn, a) for a in ("head_dim", "scaling", "layer_idx")) and hasattr(mlp, "act_fn"))

    def __call__(self, hidden: torch.Tensor, pos: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                 mask: torch.Tensor | None, cache: Any, attention: Callable[..., tuple[torch.Tensor, Any]]
                 ) -> torch.Tensor:
        return layer_forward(self.layer, hidden, rope, mask, cache, attention, self.rope)


class Decoder:
    """Decode steps of one served model (rebuilt whenever its weights or modules may have changed)."""

    def __init__(self, model: Any) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        base = model.model
        cfg = model.config.get_text_config()
        self.embed, self.rotary, self.norm, self.head = base.embed_tokens, base.rotary_emb, base.norm, model.lm_head
        self.attention = ALL_ATTENTION_FUNCTIONS[cfg._attn_implementation]  # "sdpa" (Decoder.of)
        self.layers: list[Callable[..., torch.Tensor]] = []
        for layer in base.layers:
            rope = getattr(sys.modules[type(layer.self_attn).__module__], "apply_rotary_pos_emb", None)
            self.layers.append(_Layer(layer, rope) if rope is not None and _Layer.plain(layer) else self._whole(layer))
        self.reproduced = sum(isinstance(layer, _Layer) for layer in self.layers)  # the rest run their own forward

    @staticmethod
    def _whole(layer: Any) -> Callable[..., torch.Tensor]:
        """A layer that is not made of the plain parts: its own forward, with the same inputs."""
        params = inspect.signature(layer.forward).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"

        def run(hidden: torch.Tensor, pos: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None, cache: Any, attention: Any) -> torch.Tensor:
            out = layer(hidden, attention_mask=mask, position_ids=pos, position_embeddings=rope, use_cache=True,
                        **{cache_kw: cache})
            hidden_out: torch.Tensor = out[0] if isinstance(out, tuple) else out  # before 5: (hidden_states, ...)
            return hidden_out
        return run

    @staticmethod
    def of(model: Any) -> Decoder | PlainDecoderLM | None:
        """The decoder of `model`, or None where only its full forward is known to be right. The engine's own
        implementation (model/plain_decoder.py) decodes itself."""
        if isinstance(model, PlainDecoderLM):
            return model
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
        mask = decode_mask(pads, cache.get_seq_length() + 1, ids.device)
        with torch.inference_mode():
            hidden = self.embed(ids)
            rope = self.rotary(hidden, pos)
            for layer in self.layers:
                hidden = layer(hidden, pos, rope, mask, cache, self.attention)
            logits: torch.Tensor = self.head(self.norm(hidden))
        return logits[:, -1, :]
