"""Use StatelessAdam through megatron-core's own optimizer factory (tested against megatron-core 0.16.1).

megatron.core.optimizer picks its Adam class from module globals bound at import time:
`Adam` (Transformer Engine / Apex FusedAdam, or torch AdamW when neither is installed),
`CPUAdam` (torch AdamW, for CPU offloading) and, when `USING_PYTORCH_OPTIMIZER` is set,
`torch.optim.Adam` / `torch.optim.AdamW` looked up at call time. The distributed optimizer
only accepts instances of its own module's `Adam`. While the context is active these names
point at StatelessAdam (and the fused-Adam branch, which passes `adam_w_mode`, is taken);
every megatron optimizer built around a StatelessAdam gets a no-op state initialisation, so
checkpointing never materialises moments. megatron-core is imported lazily, only here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from slimecli.config.groups.optimizer import OptimizerConfig
from slimecli.train.optim.stateless_adam import StatelessAdam

_MISSING = object()


def _no_state_init(*_args: Any, **_kwargs: Any) -> None:
    """Replacement for megatron's init_state_fn / dummy-state initialisation: there is no state."""


def _is_stateless(inner: Any) -> bool:
    if isinstance(inner, StatelessAdam):
        return True
    subs = getattr(inner, "sub_optimizers", None)  # HybridDeviceOptimizer (CPU offloading)
    if not subs:
        return False
    return all(isinstance(s, StatelessAdam) for s in subs)


def make_megatron_optimizer_stateless(opt: Any) -> None:
    """Turn off state initialisation on a megatron optimizer (or chain) that wraps StatelessAdam."""
    for part in getattr(opt, "chained_optimizers", None) or [opt]:
        if _is_stateless(getattr(part, "optimizer", None)):
            part.init_state_fn = _no_state_init
            if hasattr(part, "_init_optimizer_states_with_dummy_values"):  # DistributedOptimizer
                part._init_optimizer_states_with_dummy_values = _no_state_init


def _bound_class(extra: dict[str, Any]) -> type[StatelessAdam]:
    """StatelessAdam with options megatron's factory never passes (bias_correction, maximize) fixed."""
    if not extra:
        return StatelessAdam

    class BoundStatelessAdam(StatelessAdam):
        def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(params, *args, **{**kwargs, **extra})

    return BoundStatelessAdam


@contextlib.contextmanager
def stateless_adam_in_megatron(*, bias_correction: bool = True, maximize: bool = False) -> Iterator[type]:
    """While active, megatron-core's optimizer factory builds StatelessAdam instead of Adam.

    Everything is restored on exit, also when building fails. Yields the class that is patched in.
    """
    import megatron.core.optimizer as mco
    from megatron.core.optimizer import distrib_optimizer as mdo
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    if not hasattr(mco, "Adam") or not hasattr(mdo, "Adam"):
        raise RuntimeError("this megatron-core version has no megatron.core.optimizer.Adam to patch; "
                           "StatelessAdam is tested with megatron-core 0.16.1")
    extra: dict[str, Any] = {}
    if not bias_correction:
        extra["bias_correction"] = False
    if maximize:
        extra["maximize"] = True
    cls = _bound_class(extra)
    original_init = MegatronOptimizer.__dict__["__init__"]

    def init_without_state(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        make_megatron_optimizer_stateless(self)

    patches: list[tuple[Any, str, Any]] = [
        (mco, "Adam", cls),
        (mco, "CPUAdam", cls),
        (mco, "USING_PYTORCH_OPTIMIZER", False),  # take the fused-Adam branch: it passes adam_w_mode
        (mdo, "Adam", StatelessAdam),  # the distributed optimizer's isinstance check
        (MegatronOptimizer, "__init__", init_without_state),
    ]
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, value in patches:
            saved.append((owner, name, vars(owner).get(name, _MISSING)))
            setattr(owner, name, value)
        yield cls
    finally:
        for owner, name, value in reversed(saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def megatron_optimizer_context(cfg: OptimizerConfig) -> contextlib.AbstractContextManager[Any]:
    """The context to build megatron-core's optimizer in: the StatelessAdam patch, or nothing for adam."""
    if cfg.name == "stateless_adam":
        return stateless_adam_in_megatron(bias_correction=cfg.bias_correction, maximize=cfg.maximize)
    return contextlib.nullcontext()


def megatron_optimizer_kwargs(cfg: OptimizerConfig) -> dict[str, Any]:
    """Arguments for megatron.core.optimizer.OptimizerConfig that `optimizer.*` determines."""
    if cfg.name == "adam" and (cfg.maximize or cfg.amsgrad or not cfg.bias_correction):
        raise ValueError("megatron-core's Adam supports neither optimizer.maximize, optimizer.amsgrad "
                         "nor optimizer.bias_correction=false")
    return dict(optimizer="adam", lr=cfg.lr, min_lr=cfg.min_lr, weight_decay=cfg.weight_decay,
                adam_beta1=cfg.betas[0], adam_beta2=cfg.betas[1], adam_eps=cfg.eps,
                decoupled_weight_decay=cfg.adam_w_mode, clip_grad=cfg.clip_grad)
