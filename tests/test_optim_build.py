"""build_optimizer / build_scheduler / state helpers from composed configs, and the optimizer rules."""

from __future__ import annotations

import math

import pytest
import torch

from slimecli.config.compose import load
from slimecli.train.optim.build import (
    build_optimizer,
    build_scheduler,
    lr_factor,
    optimizer_state_for_checkpoint,
    reset_optimizer_state,
    restore_optimizer_state,
)
from slimecli.train.optim.stateless_adam import StatelessAdam
from tests.helpers.config_errors import errors_of


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


def train_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range, sched=None) -> None:
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 2, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def test_adam_builds_adamw_or_l2_adam_with_foreach() -> None:
    model = tiny_model()
    opt = build_optimizer(model.named_parameters(), load(["optimizer=adam", "optimizer.weight_decay=0.1"]).optimizer)
    assert type(opt) is torch.optim.AdamW and opt.defaults["foreach"] is True
    decay, no_decay = opt.param_groups  # biases and the LayerNorm scale get no weight decay
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert [p.shape for p in decay["params"]] == [(8, 6), (2, 8)] and len(no_decay["params"]) == 4
    l2 = build_optimizer(model.parameters(), load(["optimizer.adam_w_mode=false", "optimizer.lr=3e-4"]).optimizer)
    assert type(l2) is torch.optim.Adam and l2.defaults["lr"] == 3e-4 and len(l2.param_groups) == 1


def test_stateless_adam_builds_stateless() -> None:
    cfg = load(["optimizer=stateless_adam", "optimizer.lr=2e-6", "optimizer.betas=[0.8,0.9]",
                "optimizer.bias_correction=false", "optimizer.maximize=true"]).optimizer
    opt = build_optimizer(tiny_model().parameters(), cfg)
    assert isinstance(opt, StatelessAdam)
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["bias_correction"], g["maximize"], g["adam_w_mode"]) == (2e-6, (0.8, 0.9),
                                                                                           False, True, True)


def test_frozen_params_are_left_out() -> None:
    model = tiny_model()
    model[0].weight.requires_grad_(False)
    opt = build_optimizer(model.named_parameters(), load([]).optimizer)
    assert all(p is not model[0].weight for g in opt.param_groups for p in g["params"])


def test_stateless_equals_adamw_reset_each_step() -> None:
    """reset_optimizer_state turns AdamW into a first step every time: the same as StatelessAdam."""
    cfg = load(["optimizer.lr=1e-2", "optimizer.weight_decay=0.05"]).optimizer
    m1, m2 = tiny_model(), tiny_model()
    adamw = build_optimizer(m1.named_parameters(), cfg)
    stateless = build_optimizer(m2.named_parameters(), load(["optimizer=stateless_adam", "optimizer.lr=1e-2",
                                                             "optimizer.weight_decay=0.05"]).optimizer)
    for step in range(4):
        train_steps(m1, adamw, range(step, step + 1))
        assert len(adamw.state) > 0
        reset_optimizer_state(adamw)
        assert len(adamw.state) == 0
        train_steps(m2, stateless, range(step, step + 1))
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_schedule_shapes() -> None:
    def lrs(*overrides: str, max_steps: int = 10) -> list[float]:
        cfg = load(["optimizer.lr=1.0", *overrides]).optimizer
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
        sched = build_scheduler(opt, cfg, max_steps)
        out = []
        for _ in range(max_steps + 2):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    assert lrs() == [1.0] * 12
    assert lrs("optimizer.lr_warmup_steps=4") == [0.25, 0.5, 0.75] + [1.0] * 9
    lin = lrs("optimizer.lr_decay_style=linear", "optimizer.min_lr=0.2", "optimizer.lr_warmup_steps=2")
    assert lin[:3] == [0.5, 1.0, 1.0]
    assert lin[2:] == pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.2])
    cos = lrs("optimizer.lr_decay_style=cosine", "optimizer.lr_decay_steps=4")
    assert cos == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
                                + [0.0] * 8)
    assert lrs("optimizer.lr_decay_style=cosine", "optimizer.min_lr=0.1")[-3:] == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.9)), 0.1, 0.1])


def test_schedule_keeps_group_lr_ratios() -> None:
    cfg = load(["optimizer.lr=1e-3", "optimizer.lr_decay_style=linear"]).optimizer
    a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 2e-3}], lr=cfg.lr)
    sched = build_scheduler(opt, cfg, max_steps=4)
    for _ in range(2):
        opt.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([5e-4, 1e-3])
    assert lr_factor(0, load(["optimizer.lr=0", "optimizer.lr_decay_style=cosine"]).optimizer, 5) == 1.0


def test_checkpoint_state_helper() -> None:
    model = tiny_model()
    adam_cfg = load([]).optimizer
    adamw = build_optimizer(model.parameters(), adam_cfg)
    train_steps(model, adamw, range(1))
    state = optimizer_state_for_checkpoint(adamw, adam_cfg)
    assert state is not None and "exp_avg" in state["state"][0]
    assert optimizer_state_for_checkpoint(adamw, load(["optimizer.save_state=false"]).optimizer) is None
    stateless_cfg = load(["optimizer=stateless_adam"]).optimizer
    stateless = build_optimizer(model.parameters(), stateless_cfg)
    assert optimizer_state_for_checkpoint(stateless, stateless_cfg) is None

    fresh = build_optimizer(model.parameters(), adam_cfg)
    restore_optimizer_state(fresh, None)
    assert len(fresh.state) == 0
    restore_optimizer_state(fresh, state)
    torch.testing.assert_close(fresh.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])


def test_stateless_run_resumes_from_a_checkpoint_without_moments(tmp_path) -> None:
    """4 steps straight == 2 steps, checkpoint (model + scheduler, no optimizer moments), rebuild, 2 steps."""
    cfg = load(["optimizer=stateless_adam", "optimizer.lr=1e-2", "optimizer.lr_decay_style=cosine",
                "optimizer.lr_warmup_steps=1", "optimizer.weight_decay=0.1"]).optimizer
    straight = tiny_model()
    opt = build_optimizer(straight.named_parameters(), cfg)
    train_steps(straight, opt, range(4), build_scheduler(opt, cfg, max_steps=4))

    first = tiny_model()
    opt = build_optimizer(first.named_parameters(), cfg)
    sched = build_scheduler(opt, cfg, max_steps=4)
    train_steps(first, opt, range(2), sched)
    torch.save({"model": first.state_dict(), "scheduler": sched.state_dict(),
                "optimizer": optimizer_state_for_checkpoint(opt, cfg)}, tmp_path / "ckpt.pt")

    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["optimizer"] is None
    resumed = tiny_model(seed=123)
    resumed.load_state_dict(ckpt["model"])
    opt = build_optimizer(resumed.named_parameters(), cfg)
    restore_optimizer_state(opt, ckpt["optimizer"])
    sched = build_scheduler(opt, cfg, max_steps=4)
    sched.load_state_dict(ckpt["scheduler"])  # also puts the lr back into the optimizer
    train_steps(resumed, opt, range(2, 4), sched)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_adam_without_bias_correction_is_refused_by_builder_too() -> None:
    cfg = load(["optimizer=stateless_adam", "optimizer.bias_correction=false"]).optimizer
    with pytest.raises(ValueError, match="only supported by optimizer=stateless_adam"):
        build_optimizer(tiny_model().parameters(), type(cfg)(**{**cfg.__dict__, "name": "adam"}))


# ---- validation messages, exactly as users see them -------------------------------------------
def test_stateless_adam_refuses_amsgrad_and_state() -> None:
    msgs = errors_of(["optimizer=stateless_adam", "optimizer.amsgrad=true", "optimizer.save_state=true"])
    assert msgs == [
        "optimizer.amsgrad: stateless_adam keeps no moments, so amsgrad is impossible (got True)\n"
        "    hint: set optimizer.amsgrad=false or use optimizer=adam",
        "optimizer.save_state: stateless_adam has no optimizer state to save (got True)\n"
        "    hint: set optimizer.save_state=false",
    ]


def test_master_weights_is_no_config_key() -> None:
    """The torch trainer keeps no fp32 master copies and stateless_adam refuses them: the knob did nothing."""
    (msg,) = errors_of(["optimizer.use_master_weights=true"])
    assert msg.startswith("optimizer.use_master_weights: unknown key")


def test_only_adam_semantics_are_accepted() -> None:
    assert errors_of(["optimizer.name=sgd"]) == [
        "optimizer.name: not an allowed value (got 'sgd')\n    hint: allowed: adam, stateless_adam"]
    assert errors_of(["optimizer.bias_correction=false"]) == [
        "optimizer.bias_correction: optimizer=adam always applies bias correction (torch and megatron-core Adam) "
        "(got False)\n    hint: set optimizer.bias_correction=true or use optimizer=stateless_adam"]
    assert load(["optimizer=stateless_adam", "optimizer.bias_correction=false"]).optimizer.bias_correction is False


def test_schedule_rules() -> None:
    assert errors_of(["optimizer.lr_decay_style=cosine", "optimizer.lr_warmup_steps=200", "trainer.max_steps=100"]) == [
        "optimizer.lr_warmup_steps: warm-up must end before the cosine decay does: must be <= "
        "trainer.max_steps=100 (optimizer.lr_decay_steps is null) (got 200)"]
    assert errors_of(["optimizer.lr_decay_style=linear", "optimizer.lr_warmup_steps=20",
                      "optimizer.lr_decay_steps=10"]) == [
        "optimizer.lr_warmup_steps: warm-up must end before the linear decay does: must be <= "
        "optimizer.lr_decay_steps=10 (got 20)"]
    assert errors_of(["optimizer.lr_decay_steps=0"]) == [
        "optimizer.lr_decay_steps: must be >= 1 (or null for trainer.max_steps) (got 0)"]
    load(["optimizer.lr_warmup_steps=200"])  # constant schedule: a long warm-up is fine
