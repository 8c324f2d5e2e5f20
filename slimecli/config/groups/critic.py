"""trainer.critic: the learned value function of trainer.advantage_estimator=gae (PPO with a critic)."""

from __future__ import annotations

from dataclasses import dataclass

from slimecli.config.decode import spec


@dataclass(frozen=True)
class CriticConfig:
    """A value model: the policy's transformer (or model_path's) with a scalar head on every position, trained
    beside the policy on the clipped value loss against GAE's returns. Used only by estimators that ask for
    values (trainer.advantage_estimator=gae); its weights and optimizer state travel in the checkpoints."""

    model_path: str | None = spec(None, nonempty=True)  # None: model.path (the policy's starting weights)
    # the critic's own constant learning rate (verl's critic.optim.lr)
    optim_lr: float | None = spec(None, gt=0, note="None: optimizer.lr")
    lam: float = spec(1.0, ge=0, le=1)  # GAE's lambda (trainer.gamma is its discount)
    value_clip: float | None = spec(0.5, gt=0, note="None: the value loss is not clipped")  # |V - V_old| bound
    grad_clip: float = spec(1.0, ge=0, note="0: no clipping")  # the critic's gradient-norm bound (verl's critic.grad_clip)
