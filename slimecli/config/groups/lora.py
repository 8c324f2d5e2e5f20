"""trainer.lora: train low-rank adapters instead of the whole model (peft's LoRA), off while rank is 0.

The module names a model's LoRA can target are known per architecture without loading torch, so that
`config validate` can check trainer.lora.target_modules (and give a did-you-mean) before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec

# the linear layers of each decoder block, as Hugging Face names them (peft matches these name suffixes)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LLAMA_LIKE = (*PROJECTIONS, "lm_head")
ARCHITECTURE_MODULES: dict[str, tuple[str, ...]] = {
    "Qwen3ForCausalLM": _LLAMA_LIKE,
    "Qwen2ForCausalLM": _LLAMA_LIKE,
    "LlamaForCausalLM": _LLAMA_LIKE,
    "MistralForCausalLM": _LLAMA_LIKE,
}
# trainer.lora.target_modules unset: the decoder blocks' projections; model=tiny adds its output layer, because
# its 64-wide hidden state goes through a normalisation before a head whose logits span about +-1, so adapters
# on the blocks alone cannot make any token likely (measured: the quickstart stays at its initial reward)
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {"tiny": _LLAMA_LIKE}
# model presets whose architecture is known without reading a file (model=tiny is created as Qwen3)
PRESET_ARCHITECTURES = {"tiny": "Qwen3ForCausalLM", "qwen3_0_6b": "Qwen3ForCausalLM"}


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the target modules; the base weights stay frozen and only the adapters train,
    get optimizer state, reach the engines and fill the checkpoints."""

    rank: int = spec(0, ge=0, note="0 turns LoRA off")  # 0: LoRA off (full fine-tuning); > 0: the adapters' rank r
    alpha: int = spec(32, gt=0, note="the update is scaled by alpha/rank")  # the update is scaled by alpha / rank
    dropout: float = spec(0.0, ge=0, lt=1)  # dropout on the adapters' input (training only)
    target_modules: tuple[str, ...] | None = None  # None: DEFAULT_TARGETS of the model preset, else PROJECTIONS
    # default: A random (Kaiming), B zero; gaussian: A normal. Both start as the base model (B = 0), so the
    # engines, which start from model.path, serve the trainer's policy before the first push.
    init: Literal["default", "gaussian"] = "default"

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank if self.rank > 0 else 0.0

    def targets(self, model_name: str) -> tuple[str, ...]:
        """The modules that get adapters (model_name: model.name, which picks the default)."""
        if self.target_modules is not None:
            return self.target_modules
        return DEFAULT_TARGETS.get(model_name, PROJECTIONS)
