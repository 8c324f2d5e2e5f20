from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class OptimizerConfig:
    """adam = AdamW (or L2 Adam); stateless_adam = Adam whose moments reset every step."""

    name: Literal["adam", "stateless_adam"] = "adam"
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    adam_w_mode: bool = True  # decoupled weight decay (AdamW); False -> L2 added to the gradient
    bias_correction: bool = True
    maximize: bool = False
    clip_grad: float = 1.0  # 0 disables clipping
    lr_warmup_steps: int = 0
    lr_decay_style: Literal["constant", "cosine", "linear"] = "constant"
    lr_decay_steps: int | None = None  # None -> trainer.max_steps
    min_lr: float = 0.0
    reset_state_each_step: bool = False
    save_state: bool = True  # store optimizer moments in checkpoints
