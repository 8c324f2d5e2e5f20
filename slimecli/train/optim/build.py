"""Build the optimizer and lr schedule that `optimizer.*` describes, for the torch trainer."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from slimecli.config.groups.optimizer import OptimizerConfig
from slimecli.train.optim.stateless_adam import StatelessAdam


def _no_decay(name: str, p: torch.Tensor) -> bool:
    """Biases and 1-D parameters (norm scales) conventionally get no weight decay."""
    return p.ndim < 2 or name.endswith("bias")


def param_groups(named_params_or_params: Iterable[Any], weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters as optimizer groups.

    (name, param) pairs are split into a decayed group and a group without weight decay
    (biases, 1-D params); plain params or ready-made group dicts are used as given.
    """
    items = list(named_params_or_params)
    if items and isinstance(items[0], dict):
        return items
    if items and isinstance(items[0], tuple):
        decay = [p for n, p in items if p.requires_grad and not _no_decay(n, p)]
        keep = [p for n, p in items if p.requires_grad and _no_decay(n, p)]
        if weight_decay == 0 or not keep:
            return [{"params": decay + keep}]
        return [g for g in ({"params": decay}, {"params": keep, "weight_decay": 0.0}) if g["params"]]
    return [{"params": [p for p in items if p.requires_grad]}]


def build_optimizer(named_params_or_params: Iterable[Any], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """adam -> torch AdamW (adam_w_mode) or L2 Adam, multi-tensor; stateless_adam -> StatelessAdam.

    Master weights are the trainer's business (the optimizer sees whatever params it is given).
    """
    groups = param_groups(named_params_or_params, cfg.weight_decay)
    common: dict[str, Any] = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                                  amsgrad=cfg.amsgrad, maximize=cfg.maximize)
    if cfg.name == "stateless_adam":
        return StatelessAdam(groups, **common, bias_correction=cfg.bias_correction, adam_w_mode=cfg.adam_w_mode)
    if cfg.name == "adam":
        if not cfg.bias_correction:
            raise ValueError("optimizer.bias_correction=false is only supported by optimizer=stateless_adam")
        cls = torch.optim.AdamW if cfg.adam_w_mode else torch.optim.Adam
        return cls(groups, **common, foreach=True)
    raise ValueError(f"unknown optimizer.name {cfg.name!r}")


def lr_factor(step: int, cfg: OptimizerConfig, max_steps: int) -> float:
    """lr at `step` (optimizer steps already taken) as a fraction of cfg.lr.

    Linear warm-up reaches cfg.lr at step lr_warmup_steps-1; decay runs from lr_warmup_steps to
    lr_decay_steps (None -> max_steps, counted from the start like the warm-up) and stays at min_lr after.
    """
    warmup = cfg.lr_warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if cfg.lr_decay_style == "constant" or cfg.lr == 0:
        return 1.0
    decay_end = cfg.lr_decay_steps if cfg.lr_decay_steps is not None else max_steps
    span = decay_end - warmup
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    if cfg.lr_decay_style == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    floor = cfg.min_lr / cfg.lr
    return floor + (1.0 - floor) * shape


class Schedule(LambdaLR):
    """LambdaLR whose load_state_dict also puts the resumed lr back into the optimizer's groups.

    LambdaLR alone leaves the groups at the step-0 lr until its next step(); an Adam checkpoint
    hides that by restoring the groups, but a stateless_adam checkpoint carries no optimizer state.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group, lr in zip(self.optimizer.param_groups, self.get_last_lr(), strict=True):
            group["lr"] = lr


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig, max_steps: int) -> Schedule:
    """Call scheduler.step() after every optimizer.step(); groups keep their lr ratios to cfg.lr."""
    return Schedule(optimizer, lambda step: lr_factor(step, cfg, max_steps))


def reset_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Drop all moments and step counts (optimizer.reset_state_each_step): the next step is a first step."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(opt).__name__}")
    opt.state.clear()


def keeps_optimizer_state(cfg: OptimizerConfig) -> bool:
    """Whether checkpoints store optimizer moments (never for stateless_adam)."""
    return cfg.name != "stateless_adam" and cfg.save_state


def optimizer_state_for_checkpoint(opt: torch.optim.Optimizer, cfg: OptimizerConfig) -> dict[str, Any] | None:
    """What a checkpoint stores for the optimizer: None when there is nothing worth saving."""
    if not keeps_optimizer_state(cfg) or isinstance(opt, StatelessAdam):
        return None
    return opt.state_dict()


def restore_optimizer_state(opt: torch.optim.Optimizer, state: dict[str, Any] | None) -> None:
    """Counterpart of optimizer_state_for_checkpoint: None leaves a fresh optimizer as built."""
    if state is not None:
        opt.load_state_dict(state)
