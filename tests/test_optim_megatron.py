"""The megatron-core patch: classes swapped inside, restored after (also on error), and what the
factory builds with it.

Without CUDA, megatron-core 0.16.1 builds the inner Adam and enters the wrapper's constructor
(FP32Optimizer / DistributedOptimizer), then fails allocating a CUDA tensor. The tests call the
real factory and, on a CPU-only torch, inspect the half-built wrapper from the traceback: the inner
optimizer and the state-initialisation hooks are set before that point. With CUDA the factory
returns and the same checks run on the finished optimizer.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from slimecli.config.compose import load
from slimecli.train.optim.stateless_adam import StatelessAdam

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    mco = pytest.importorskip("megatron.core.optimizer")
from megatron.core.optimizer import OptimizerConfig
from megatron.core.optimizer import distrib_optimizer as mdo
from megatron.core.optimizer.optimizer import MegatronOptimizer

from slimecli.train.optim.megatron_patch import (
    megatron_optimizer_context,
    megatron_optimizer_kwargs,
    stateless_adam_in_megatron,
)

NAMES = ((mco, "Adam"), (mco, "CPUAdam"), (mco, "USING_PYTORCH_OPTIMIZER"), (mdo, "Adam"),
         (MegatronOptimizer, "__init__"))


def snapshot() -> list[Any]:
    return [vars(owner)[name] for owner, name in NAMES]


def build(config: OptimizerConfig, params: list[torch.Tensor]) -> MegatronOptimizer:
    """megatron-core's factory for one param group; the (maybe half-built) megatron optimizer."""
    try:
        return mco._get_megatron_optimizer_based_on_param_groups(
            config, model_chunks=[], param_groups=[{"params": params, "wd_mult": 1.0, "lr_mult": 1.0}])
    except (AssertionError, RuntimeError) as exc:
        if torch.cuda.is_available() or "CUDA" not in str(exc):
            raise
        built, tb = None, exc.__traceback__
        while tb is not None:
            candidate = tb.tb_frame.f_locals.get("self")
            if isinstance(candidate, MegatronOptimizer):
                built = candidate
            tb = tb.tb_next
        assert built is not None, "megatron-core failed before building an optimizer"
        return built


def test_classes_swapped_inside_and_restored_after() -> None:
    before = snapshot()
    with stateless_adam_in_megatron() as cls:
        assert cls is StatelessAdam
        assert mco.Adam is StatelessAdam and mco.CPUAdam is StatelessAdam and mdo.Adam is StatelessAdam
        assert mco.USING_PYTORCH_OPTIMIZER is False
        assert vars(MegatronOptimizer)["__init__"] is not before[-1]
        # the distributed optimizer's own acceptance test for its inner optimizer
        assert isinstance(StatelessAdam([torch.zeros(1, requires_grad=True)]), (mdo.Adam, torch.optim.AdamW))
    assert snapshot() == before
    assert not isinstance(StatelessAdam([torch.zeros(1, requires_grad=True)]), (mdo.Adam, torch.optim.AdamW))


def test_restored_on_exception_and_when_nested() -> None:
    before = snapshot()
    with pytest.raises(ValueError, match="boom"):
        with stateless_adam_in_megatron():
            with stateless_adam_in_megatron(bias_correction=False) as inner:
                assert mco.Adam is inner and issubclass(inner, StatelessAdam)
                raise ValueError("boom")
    assert snapshot() == before


def test_factory_builds_stateless_adam_with_megatron_hparams() -> None:
    lin = torch.nn.Linear(5, 3)
    config = OptimizerConfig(lr=0.05, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6,
                             decoupled_weight_decay=False)
    with stateless_adam_in_megatron():
        opt = build(config, list(lin.parameters()))
    inner = opt.optimizer
    assert type(inner) is StatelessAdam
    group = inner.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (0.05, 0.1, (0.8, 0.95), 1e-6)
    assert group["adam_w_mode"] is False  # megatron's decoupled_weight_decay reached the optimizer

    # megatron's state initialisation (used before saving / loading checkpoints) adds nothing
    opt.init_state_fn(inner, config)
    assert len(inner.state) == 0 and inner.state_dict()["state"] == {}

    # and the inner optimizer steps like a freshly built torch Adam (L2 mode)
    ref = [p.detach().clone().requires_grad_() for p in lin.parameters()]
    for p, r in zip(lin.parameters(), ref, strict=True):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    inner.step()
    torch.optim.Adam(ref, lr=0.05, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6).step()
    for p, r in zip(lin.parameters(), ref, strict=True):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


def test_without_patch_megatron_builds_adam_with_moments() -> None:
    """The contrast: unpatched, the same call gives an Adam whose state init creates moments."""
    lin = torch.nn.Linear(5, 3)
    config = OptimizerConfig(lr=0.05)
    opt = build(config, list(lin.parameters()))
    assert not isinstance(opt.optimizer, StatelessAdam)
    opt.init_state_fn(opt.optimizer, config)
    assert {"exp_avg", "exp_avg_sq"} <= set(opt.optimizer.state[lin.weight])


def test_distributed_optimizer_state_init_is_a_no_op() -> None:
    lin = torch.nn.Linear(4, 4)
    config = OptimizerConfig(lr=0.1, weight_decay=0.5, bf16=True, use_distributed_optimizer=True)
    with stateless_adam_in_megatron():
        try:
            opt = build(config, list(lin.parameters()))
        except (TypeError, AttributeError) as exc:  # CUDA present but no DDP buffers given: out of scope
            pytest.skip(f"distributed optimizer needs megatron DDP buffers here: {exc}")
    assert isinstance(opt, mdo.DistributedOptimizer) and isinstance(opt.optimizer, StatelessAdam)
    before = [p.detach().clone() for p in lin.parameters()]
    opt._init_optimizer_states_with_dummy_values()  # unpatched: a zero-grad step, i.e. weight decay
    opt.init_state_fn(opt.optimizer, config)
    assert all(torch.equal(p, b) for p, b in zip(lin.parameters(), before, strict=True))
    assert len(opt.optimizer.state) == 0


def test_bound_options_and_config_helpers() -> None:
    cfg = load(["optimizer=stateless_adam", "optimizer.bias_correction=false", "optimizer.maximize=true",
                "optimizer.lr=1e-5", "optimizer.adam_w_mode=false"]).optimizer
    with megatron_optimizer_context(cfg):
        opt = build(OptimizerConfig(**megatron_optimizer_kwargs(cfg)), [torch.zeros(3, requires_grad=True)])
    group = opt.optimizer.param_groups[0]
    assert isinstance(opt.optimizer, StatelessAdam)
    assert (group["bias_correction"], group["maximize"], group["adam_w_mode"], group["lr"]) == (False, True, False,
                                                                                               1e-5)
    before = snapshot()
    with megatron_optimizer_context(load(["optimizer=adam"]).optimizer):
        assert snapshot() == before
    with pytest.raises(ValueError, match="maximize"):
        megatron_optimizer_kwargs(load(["optimizer.maximize=true"]).optimizer)
