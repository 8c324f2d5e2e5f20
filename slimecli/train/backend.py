"""What the training stages need from a policy back-end (trainer=torch or trainer=megatron).

The stages (stages.py) never touch a model directly: they hand packed micro-batches to a back-end and get
per-token log-probs, gradients and whole-model weights back. A back-end owns the model, its parallel layout
and its optimizer, so rollout, rewards, losses and weight sync are the same for every back-end.

A *data* rank is one model replica: under tensor or pipeline parallelism several processes form one replica
and see the same samples. ``data_rank``/``data_size`` say which replica this process belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.train.batch import PackedBatch

# (micro-batch position, log-probs [B, R], entropy [B, R] or None) -> (loss, metrics of that micro-batch)
LossFn = Callable[[int, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class PolicyBackend(Protocol):
    data_rank: int
    data_size: int

    def score(self, chunks: list[PackedBatch], temperature: float) -> list[torch.Tensor]:
        """Response log-probs [B, R] of each micro-batch at ``temperature``, without gradients, on every rank."""
        ...

    def forward_backward(self, chunks: list[PackedBatch], temperature: float, loss_fn: LossFn, *,
                         entropy_grad: bool) -> list[dict[str, float]]:
        """Forward, loss and backward of one optimizer update's micro-batches; gradients are summed over the
        micro-batches and the data ranks (the losses are already weighted for that). Returns each micro-batch's
        metrics, with the same keys on every rank: zeros where another rank of the replica reports them, so a
        sum over ranks counts each micro-batch once."""
        ...

    def optimizer_step(self, cfg: SlimeConfig) -> float:
        """Clip (optimizer.clip_grad), step and zero the gradients; the gradient norm before clipping."""
        ...

    def lr_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer whose param_groups' lr the schedule sets."""
        ...

    def full_state_dict(self, is_main: bool) -> dict[str, torch.Tensor] | None:
        """The whole model in Hugging Face names on rank 0's CPU (None elsewhere); a collective."""
        ...

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Counterpart of full_state_dict: every rank passes the whole HF state."""
        ...

    def optimizer_state(self, is_main: bool) -> dict[str, Any] | None:
        """The optimizer state for optimizer.pt, gathered on rank 0 (a back-end with save_sharded keeps it there)."""
        ...

    def save_sharded(self, directory: Path, *, with_optimizer: bool) -> bool:
        """Write the back-end's own sharded checkpoint (every rank its shards; a collective) into ``directory``;
        False, writing nothing, for a back-end that has none (then optimizer_state goes to optimizer.pt)."""
        ...

    def load_sharded(self, directory: Path, *, with_optimizer: bool) -> None: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def shared_module(self) -> torch.nn.Module | None:
        """Rank 0's unsharded HF module, whose memory a weight sync may share; None when there is none."""
        ...
