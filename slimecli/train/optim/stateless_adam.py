"""Adam whose moments are reset to zero before every step, so it keeps no state at all.

A freshly built Adam taking its first step has m = (1-β1)g and v = (1-β2)g², so with
bias correction the update collapses to lr·g/(|g|+eps) and without it to
lr(1-β1)·g/(√(1-β2)|g|+eps). Computing that directly saves both moment buffers (2x the
parameter bytes) and most of the memory traffic of a regular Adam step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import Optimizer

# Keyword arguments that fused Adam implementations (and megatron-core's factory) pass and
# that are meaningless without moment state; accepted so the class is a drop-in replacement.
# (store_param_remainders only acts together with master weights, which are refused.)
_IGNORED_KWARGS = frozenset({"exp_avg_dtype", "exp_avg_sq_dtype", "master_weight_dtype", "set_grad_none",
                             "store_param_remainders", "capturable", "fused", "differentiable"})


class StatelessAdam(Optimizer):
    """Every step equals a freshly built torch.optim.Adam (adam_w_mode=False) or AdamW taking one step.

    Group options: lr, betas, eps, weight_decay, bias_correction, adam_w_mode, maximize.
    `decoupled_grad=True` reads gradients from `p.decoupled_grad` instead of `p.grad`.
    The step count is pinned at 1 and `state` stays empty; loading a state dict keeps the
    hyper-parameters and drops any moments it carries.
    """

    step_count = 1  # bias correction always uses step 1: the moments never age (also group["step"])

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 bias_correction: bool = True, adam_w_mode: bool = True, maximize: bool = False,
                 decoupled_grad: bool = False, use_decoupled_grad: bool | None = None,
                 master_weights: bool = False,
                 foreach: bool | None = None, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - _IGNORED_KWARGS)
        if unknown:
            raise TypeError(f"StatelessAdam got unexpected keyword argument(s): {', '.join(unknown)}")
        if kwargs.get("capturable") or kwargs.get("differentiable"):
            raise ValueError("StatelessAdam supports neither capturable=True nor differentiable=True")
        if amsgrad:
            raise ValueError("StatelessAdam keeps no moments, so amsgrad (a running max of the second moment) "
                             "is impossible; use torch.optim.Adam/AdamW")
        if master_weights:
            raise ValueError("StatelessAdam does not support master weights (master_weights=True); "
                             "keep fp32 master copies outside the optimizer")
        _check_hparams(lr, betas, eps, weight_decay)
        if use_decoupled_grad is not None:  # Transformer Engine's spelling
            decoupled_grad = use_decoupled_grad
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False,
                        bias_correction=bias_correction, adam_w_mode=adam_w_mode, maximize=maximize,
                        step=self.step_count)
        self.decoupled_grad = decoupled_grad
        self.foreach = foreach is not False
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if param_group.get("amsgrad"):
            raise ValueError("StatelessAdam keeps no moments, so a param group cannot ask for amsgrad")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hparams(group["lr"], group["betas"], group["eps"], group["weight_decay"])

    # ---- state: there is none -------------------------------------------------------------
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            if group.get("amsgrad"):
                raise ValueError("StatelessAdam cannot load a param group with amsgrad=True")
            group["step"] = self.step_count
        self.state = defaultdict(dict)  # discard any moments that came with the state dict

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["state"] = {}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load hyper-parameters; moments (e.g. from an AdamW checkpoint) are discarded."""
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})

    # ---- the update -------------------------------------------------------------------------
    def _grad_of(self, p: torch.Tensor) -> torch.Tensor | None:
        g = getattr(p, "decoupled_grad", None) if self.decoupled_grad else p.grad
        if g is not None and g.is_sparse:
            raise RuntimeError("StatelessAdam does not support sparse gradients")
        return g

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.state:  # someone wrote moments into us (e.g. a generic init hook): drop them
            self.state.clear()
        for group in self.param_groups:
            group["step"] = self.step_count  # like fused Adams, the count lives in the group; it never moves
            buckets: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
            for p in group["params"]:
                g = self._grad_of(p)
                if g is None:
                    continue
                if torch.is_complex(p):
                    p, g = torch.view_as_real(p), torch.view_as_real(g)
                ps, gs = buckets.setdefault((p.device, p.dtype), ([], []))
                ps.append(p)
                gs.append(g)
            for ps, gs in buckets.values():
                if self.foreach:
                    _update_foreach(ps, gs, group)
                else:
                    for p, g in zip(ps, gs, strict=True):
                        _update_foreach([p], [g], group)
        return loss


def _check_hparams(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not eps >= 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"Invalid betas: {betas} (each must be in [0, 1))")
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _update_foreach(params: list[torch.Tensor], grads: list[torch.Tensor] | tuple[torch.Tensor, ...],
                    group: dict[str, Any]) -> None:
    """p -= step·g/(c·|g|+eps) for one (device, dtype) bucket, three multi-tensor passes."""
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    beta1, beta2 = group["betas"]
    maximize = group["maximize"]
    if wd != 0 and not group["adam_w_mode"]:  # L2: the decay enters the gradient before the moments
        grads = torch._foreach_add(torch._foreach_neg(grads) if maximize else grads, params, alpha=wd)
        maximize = False
    denom = torch._foreach_abs(grads)
    if group["bias_correction"]:
        step_size = lr
    else:
        step_size = lr * (1.0 - beta1)
        torch._foreach_mul_(denom, math.sqrt(1.0 - beta2))
    torch._foreach_add_(denom, eps)
    if wd != 0 and group["adam_w_mode"]:
        torch._foreach_mul_(params, 1.0 - lr * wd)
    # maximize flips the sign of g; g/(|g|+eps) is odd in g, so only the sign of the step changes
    torch._foreach_addcdiv_(params, grads, denom, value=step_size if maximize else -step_size)
