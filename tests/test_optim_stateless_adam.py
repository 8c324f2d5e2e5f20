"""StatelessAdam against a freshly built torch Adam/AdamW at every step, and its (absent) state.

Tolerances: fp32 parameters must agree to rtol=1e-6 / atol=1e-7 over the whole trajectory (the
only difference is float rounding of an algebraically equal update); bf16 parameters to one
bf16 rounding of the parameter or of the update (rtol=2**-7, atol=lr*2**-7) per step, starting
each step from the same values.
"""

from __future__ import annotations

import math

import pytest
import torch

from slimecli.train.optim.stateless_adam import StatelessAdam

GROUPS = ({"lr": 0.05, "weight_decay": 0.0}, {"lr": 0.01, "weight_decay": 0.1}, {"lr": 0.2, "weight_decay": 0.03})
SHAPES = ((7, 5), (13,), (3, 4, 2))
BETAS, EPS = (0.8, 0.95), 1e-6


def make_params(dtype: torch.dtype, seed: int = 0) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in SHAPES] for _ in GROUPS]


def clone(groups: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    return [[p.detach().clone().requires_grad_() for p in ps] for ps in groups]


def as_groups(params: list[list[torch.Tensor]]) -> list[dict]:
    return [{"params": ps, **hp} for ps, hp in zip(params, GROUPS, strict=True)]


def set_grads(step: int, *param_sets: list[list[torch.Tensor]]) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for gi, ps in enumerate(param_sets[0]):
        for pi, p in enumerate(ps):
            g = torch.randn(p.shape, generator=gen).to(p.dtype)
            if gi == 1 and pi == 1:  # a parameter without gradient this step: must be left alone
                g = None
            for params in param_sets:
                params[gi][pi].grad = None if g is None else g.clone()


def reference_step(params: list[list[torch.Tensor]], adam_w_mode: bool, maximize: bool) -> None:
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    cls(as_groups(params), betas=BETAS, eps=EPS, maximize=maximize).step()  # fresh: moments are zero


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["decoupled", "l2"])
@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
def test_fp32_trajectory_equals_fresh_torch_adam_each_step(adam_w_mode: bool, maximize: bool) -> None:
    ours, ref = make_params(torch.float32), make_params(torch.float32)
    opt = StatelessAdam(as_groups(ours), betas=BETAS, eps=EPS, adam_w_mode=adam_w_mode, maximize=maximize)
    start = [p.detach().clone() for ps in ours for p in ps]
    for step in range(5):
        set_grads(step, ours, ref)
        opt.step()
        reference_step(ref, adam_w_mode, maximize)
        for a, b in zip(sum(ours, []), sum(ref, []), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    moved = [not torch.equal(a, p) for a, p in zip(sum(ours, []), start, strict=True)]
    assert all(moved[:4]) and not moved[4]  # group 1 param 1 never had a gradient
    assert len(opt.state) == 0


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["decoupled", "l2"])
@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
def test_bf16_each_step_equals_fresh_torch_adam(adam_w_mode: bool, maximize: bool) -> None:
    ours = make_params(torch.bfloat16)
    opt = StatelessAdam(as_groups(ours), betas=BETAS, eps=EPS, adam_w_mode=adam_w_mode, maximize=maximize)
    for step in range(4):
        ref = clone(ours)
        set_grads(step, ours, ref)
        before = [p.detach().clone() for p in sum(ours, [])]
        opt.step()
        reference_step(ref, adam_w_mode, maximize)
        for i, (a, b) in enumerate(zip(sum(ours, []), sum(ref, []), strict=True)):
            assert a.dtype == torch.bfloat16
            torch.testing.assert_close(a, b, rtol=2**-7, atol=GROUPS[i // len(SHAPES)]["lr"] * 2**-7)
        assert sum(not torch.equal(a, b) for a, b in zip(sum(ours, []), before, strict=True)) == 8
    assert opt.state_dict()["state"] == {}


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["decoupled", "l2"])
@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
def test_without_bias_correction_matches_closed_form(adam_w_mode: bool, maximize: bool) -> None:
    """p -= lr(1-β1)·g/(√(1-β2)|g|+eps), g including the L2 term; decoupled decay scales p first."""
    ours = make_params(torch.float32)
    opt = StatelessAdam(as_groups(ours), betas=BETAS, eps=EPS, bias_correction=False, adam_w_mode=adam_w_mode,
                        maximize=maximize)
    b1, b2 = BETAS
    for step in range(4):
        expect = [p.detach().double().clone() for p in sum(ours, [])]
        set_grads(step, ours)
        for i, p in enumerate(sum(ours, [])):
            if p.grad is None:
                continue
            hp = GROUPS[i // len(SHAPES)]
            g = -p.grad.double() if maximize else p.grad.double()
            if adam_w_mode:
                expect[i] *= 1 - hp["lr"] * hp["weight_decay"]
            else:
                g = g + hp["weight_decay"] * expect[i]
            expect[i] -= hp["lr"] * (1 - b1) * g / (math.sqrt(1 - b2) * g.abs() + EPS)
        opt.step()
        for p, e in zip(sum(ours, []), expect, strict=True):
            torch.testing.assert_close(p.detach().double(), e, rtol=1e-6, atol=1e-7)


def test_bias_corrected_update_is_lr_sign_like() -> None:
    p = torch.zeros(4, requires_grad=True)
    p.grad = torch.tensor([2.0, -0.5, 1e-3, 0.0])
    StatelessAdam([p], lr=0.1, eps=1e-8).step()
    expect = -0.1 * p.grad / (p.grad.abs() + 1e-8)
    torch.testing.assert_close(p.detach(), expect, rtol=1e-6, atol=1e-9)


def test_foreach_and_per_tensor_paths_agree_and_mixed_dtypes() -> None:
    torch.manual_seed(0)
    base = [torch.randn(6, 3), torch.randn(5).bfloat16(), torch.randn(2, 2, dtype=torch.float64)]
    a = [t.clone().requires_grad_() for t in base]
    b = [t.clone().requires_grad_() for t in base]
    opt_a = StatelessAdam(a, lr=0.03, weight_decay=0.2)
    opt_b = StatelessAdam(b, lr=0.03, weight_decay=0.2, foreach=False)
    for _ in range(3):
        for x, y in zip(a, b, strict=True):
            x.grad = torch.randn_like(x)
            y.grad = x.grad.clone()
        opt_a.step()
        opt_b.step()
    for x, y, t in zip(a, b, base, strict=True):
        assert torch.equal(x, y) and x.dtype == t.dtype and not torch.equal(x, t)


def test_decoupled_grad_reads_p_decoupled_grad() -> None:
    p = torch.ones(3, requires_grad=True)
    p.grad = torch.full((3,), 5.0)  # must be ignored
    p.decoupled_grad = torch.tensor([1.0, -1.0, 0.0])
    StatelessAdam([p], lr=0.5, decoupled_grad=True).step()
    torch.testing.assert_close(p.detach(), torch.tensor([0.5, 1.5, 1.0]))
    q = torch.ones(2, requires_grad=True)
    q.decoupled_grad = torch.tensor([1.0, 1.0])
    StatelessAdam([q], lr=0.5, use_decoupled_grad=True).step()  # Transformer Engine's spelling
    torch.testing.assert_close(q.detach(), torch.tensor([0.5, 0.5]))


def test_state_stays_empty_and_step_pinned_at_one() -> None:
    p = torch.randn(4, 4, requires_grad=True)
    opt = StatelessAdam([p], lr=0.01)
    for _ in range(3):
        p.grad = torch.randn_like(p)
        opt.step()
    sd = opt.state_dict()
    assert sd["state"] == {} and len(opt.state) == 0
    assert [g["step"] for g in sd["param_groups"]] == [1] and opt.step_count == 1
    opt.state[p]["exp_avg"] = torch.ones_like(p)  # a generic "init state" hook writing moments
    assert opt.state_dict()["state"] == {}
    opt.step()
    assert len(opt.state) == 0


def test_load_state_dict_keeps_hparams_and_discards_moments() -> None:
    torch.manual_seed(1)
    p = torch.randn(5, requires_grad=True)
    adamw = torch.optim.AdamW([p], lr=0.02, weight_decay=0.3)
    p.grad = torch.randn_like(p)
    adamw.step()
    assert "exp_avg" in adamw.state_dict()["state"][0]
    opt = StatelessAdam([p], lr=0.5)
    opt.load_state_dict(adamw.state_dict())
    assert len(opt.state) == 0 and opt.state_dict()["state"] == {}
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["step"]) == (0.02, 0.3, 1)
    assert group["bias_correction"] is True and group["adam_w_mode"] is True  # filled from defaults

    again = StatelessAdam([p], lr=1.0)
    again.load_state_dict({**opt.state_dict(), "state": {0: {"exp_avg": torch.ones(5), "step": torch.tensor(7.)}}})
    assert len(again.state) == 0 and again.param_groups[0]["lr"] == 0.02 and again.param_groups[0]["step"] == 1


def test_errors_are_clear() -> None:
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="amsgrad"):
        StatelessAdam([p], lr=0.1, amsgrad=True)
    with pytest.raises(ValueError, match="master weights"):
        StatelessAdam([p], lr=0.1, master_weights=True)
    with pytest.raises(TypeError, match="unexpected keyword argument.*nesterov"):
        StatelessAdam([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        StatelessAdam([p], lr=-1.0)
    with pytest.raises(ValueError, match="Invalid betas"):
        StatelessAdam([p], lr=0.1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="amsgrad"):
        StatelessAdam([{"params": [p], "amsgrad": True}], lr=0.1)
    with pytest.raises(ValueError, match="Invalid weight_decay"):
        StatelessAdam([{"params": [p], "weight_decay": -1.0}], lr=0.1)
    with pytest.raises(ValueError, match="differentiable"):
        StatelessAdam([p], lr=0.1, differentiable=True)
    amsgrad_sd = torch.optim.Adam([p], lr=0.1, amsgrad=True).state_dict()
    with pytest.raises(ValueError, match="amsgrad"):
        StatelessAdam([p], lr=0.1).load_state_dict(amsgrad_sd)

    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        StatelessAdam(emb.parameters(), lr=0.1).step()


def test_accepts_fused_adam_keywords_megatron_passes() -> None:
    p = torch.zeros(2, requires_grad=True)
    opt = StatelessAdam(params=[p], lr=0.1, weight_decay=0.0, betas=(0.9, 0.99), eps=1e-8, adam_w_mode=False,
                        bias_correction=True, fused=True, exp_avg_dtype=torch.bfloat16, set_grad_none=True,
                        store_param_remainders=True)
    assert opt.param_groups[0]["adam_w_mode"] is False


def test_closure_is_evaluated_with_grad() -> None:
    p = torch.ones(2, requires_grad=True)
    opt = StatelessAdam([p], lr=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (p * torch.tensor([1.0, -1.0])).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 0.0
    torch.testing.assert_close(p.detach(), torch.tensor([0.9, 1.1]))
