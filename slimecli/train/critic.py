"""PPO's critic (trainer.advantage_estimator=gae): a value model beside the policy, its two stages and its state.

The value model is a Hugging Face decoder (the policy's starting weights, or trainer.critic.model_path) without
its LM head, plus a linear head that reads the hidden state of every position that predicts a response token: the
value of the state before that token, aligned with the policy's log-probs. It is replicated on every trainer rank
(DDP when there are several) and trained by its own optimizer on PPO's clipped value loss.

Stages (loop.py times them with the policy's): ``values`` (scoring, sharded like the old log-probs) before the
advantages, and ``update`` after the policy's update, over the same updates and micro-batches.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from slimecli.config.schema import SlimeConfig
from slimecli.train import dist
from slimecli.train.advantages import Advantages
from slimecli.train.batch import PackedBatch
from slimecli.train.dist import DistInfo, unwrap
from slimecli.train.losses import pad_sequences, reduce, value_loss
from slimecli.train.stages import RankContext, StepBatch, pad_to, score, update_chunks, update_slices

Tensors = list[torch.Tensor]


class ValueModel(torch.nn.Module):
    """A decoder (no LM head) and a scalar head on the positions that predict the response tokens."""

    def __init__(self, decoder: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.decoder = decoder
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)  # values start at 0: the first advantages are the returns
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, logit_index: torch.Tensor) -> torch.Tensor:
        """Values [B, R] of the positions ``logit_index`` [B, R] (those whose logits predict each response token)."""
        hidden = self.decoder(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, L, H]
        index = logit_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        picked = torch.gather(hidden, 1, index).float()
        out: torch.Tensor = self.value_head(picked).squeeze(-1)
        return out


def load_value_model(cfg: SlimeConfig, info: DistInfo) -> torch.nn.Module:
    """trainer.critic.model_path (else model.path) as a ValueModel on this rank's device, under DDP with several
    ranks. The head is float32 (a value's scale is the reward's, not a logit's)."""
    from transformers import AutoModel

    from slimecli.train.policy import DTYPES

    path = cfg.trainer.critic.model_path or cfg.model.resolved_path
    decoder = AutoModel.from_pretrained(path, dtype=DTYPES[cfg.model.dtype],
                                        trust_remote_code=cfg.model.trust_remote_code, attn_implementation="sdpa")
    if cfg.trainer.gradient_checkpointing:
        decoder.gradient_checkpointing_enable()
    model = ValueModel(decoder, int(decoder.config.hidden_size)).to(info.device)
    model.train()
    if info.world_size == 1:
        return model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


class Critic:
    """The value model and its optimizer on one trainer rank; every rank is a data rank (like TorchPolicy)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, clip_grad: float,
                 value_clip: float | None, data_rank: int = 0, data_size: int = 1):
        self.model = model
        self.optimizer = optimizer
        self.clip_grad = clip_grad
        self.value_clip = value_clip
        self.data_rank = data_rank
        self.data_size = data_size

    @torch.no_grad()
    def score(self, chunks: list[PackedBatch], temperature: float) -> list[torch.Tensor]:
        """Values [B, R] of each micro-batch (the PolicyBackend.score shape, so stages.score shards it)."""
        model = unwrap(self.model)
        return [model(packed.input_ids, packed.logit_index) for packed in chunks]

    def forward_backward(self, chunks: list[PackedBatch], loss_fn: Any) -> list[dict[str, float]]:
        """Forward, loss and backward of one update's micro-batches; gradients summed over micro-batches and
        ranks (the losses are weighted for that, DDP averages)."""
        out = []
        for c, packed in enumerate(chunks):
            last = c == len(chunks) - 1
            with self.model.no_sync() if isinstance(self.model, DistributedDataParallel) and not last else nullcontext():
                values = self.model(packed.input_ids, packed.logit_index)
                loss, metrics = loss_fn(c, values)
                (loss * self.data_size).backward()
            out.append({k: float(v) for k, v in metrics.items()})
        return out

    def optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.clip_grad > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.clip_grad))
        else:
            grads = [p.grad for p in params if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state(self, is_main: bool) -> dict[str, Any] | None:
        """The value model and optimizer state for a checkpoint's critic.pt (rank 0; the ranks hold replicas)."""
        if not is_main:
            return None
        weights = {k: v.detach().cpu() for k, v in unwrap(self.model).state_dict().items()}
        return {"model": weights, "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def make_critic(cfg: SlimeConfig, info: DistInfo) -> Critic:
    """trainer.critic's value model with its own optimizer (optimizer.*, at trainer.critic.optim_lr when set)."""
    from slimecli.train.optim.build import build_optimizer

    c = cfg.trainer.critic
    model = load_value_model(cfg, info)
    settings = dataclasses.replace(cfg.optimizer, lr=c.optim_lr) if c.optim_lr is not None else cfg.optimizer
    optimizer = build_optimizer(unwrap(model).named_parameters(), settings)
    return Critic(model, optimizer, clip_grad=c.grad_clip, value_clip=c.value_clip, data_rank=info.rank,
                  data_size=info.world_size)


# ---- the critic's stages ----------------------------------------------------------------------------------------
def values(critic: Critic, batch: StepBatch, ctx: RankContext) -> Tensors:
    """The critic's value of every response token of the batch (no gradient), sharded over the data ranks."""
    return score(critic, batch.samples, ctx)  # type: ignore[arg-type]  # a critic scores as a policy does


def update(critic: Critic, batch: StepBatch, old_values: Tensors, advantages: Advantages, cfg: SlimeConfig,
           ctx: RankContext) -> dict[str, float]:
    """One critic update per policy update (the same samples, weights and micro-batches): PPO's clipped value
    loss against the returns. Metrics: critic/value_loss, critic/vf_clipfrac, critic/values_mean,
    critic/returns_mean (token means by the loss weights) and critic/grad_norm, averaged over the updates."""
    samples = batch.samples
    slices = update_slices(samples, cfg.trainer)
    sums: dict[str, float] = {}
    norms = []
    for idx in slices:
        step_weights, chunks, packs = update_chunks(samples, idx, cfg, ctx)

        def loss_fn(c: int, predicted: torch.Tensor, chunks: list[tuple[list[int], bool]] = chunks,
                    step_weights: Tensors = step_weights) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            chunk, filler = chunks[c]
            width = predicted.shape[1]

            def rows(per_sample: Tensors) -> torch.Tensor:
                return pad_to(pad_sequences([per_sample[i] for i in chunk]), width).to(predicted.device)

            weights, returns = rows(step_weights), rows(advantages.returns)
            loss, clipped = value_loss(predicted, rows(old_values), returns, critic.value_clip)
            total = reduce(loss, weights)
            metrics = {"critic/value_loss": total.detach(), "critic/vf_clipfrac": reduce(clipped, weights),
                       "critic/values_mean": reduce(predicted.detach(), weights),
                       "critic/returns_mean": reduce(returns, weights)}
            return (total * 0.0, {k: v * 0.0 for k, v in metrics.items()}) if filler else (total, metrics)

        for metrics in critic.forward_backward(packs, loss_fn):
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + value
        norms.append(critic.optimizer_step())
    out = {k: v / max(len(slices), 1) for k, v in dist.all_reduce_sum(sums).items()}
    out["critic/grad_norm"] = sum(norms) / max(len(norms), 1)
    return out

