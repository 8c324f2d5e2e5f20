from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec


@dataclass(frozen=True)
class OptimizerConfig:
    """adam = AdamW (or L2 Adam); stateless_adam = Adam whose moments reset every step."""

    name: Literal["adam", "stateless_adam"] = "adam"
    lr: float = spec(1e-6, ge=0)
    betas: tuple[float, float] = spec((0.9, 0.999), ge=0, lt=1)
    eps: float = spec(1e-8, gt=0)
    weight_decay: float = spec(0.0, ge=0)
    amsgrad: bool = False
    adam_w_mode: bool = True  # decoupled weight decay (AdamW); False -> L2 added to the gradient
    bias_correction: bool = True
    maximize: bool = False
    clip_grad: float = spec(1.0, ge=0, note="0 disables clipping")
    lr_warmup_steps: int = spec(0, ge=0)
    lr_decay_style: Literal["constant", "cosine", "linear"] = "constant"
    lr_decay_steps: int | None = spec(None, ge=1, note="or null for trainer.max_steps")
    min_lr: float = spec(0.0, ge=0)
    reset_state_each_step: bool = False
    save_state: bool = True  # store optimizer moments in checkpoints
