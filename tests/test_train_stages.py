"""Each stage of a training step on one fixed batch of 4 samples, its output values pinned (rtol 1e-4).

The model is a seeded two-layer LM (embedding, causal running mean, linear head): the stages only read
logits. Pinned numbers were computed once; each test also checks them against an independent computation
(a direct forward, advantages by hand, an autograd reference) where one exists.
"""

from __future__ import annotations

import dataclasses
import math
import time
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch

from slimecli.checkpoint import store
from slimecli.config.schema import SlimeConfig
from slimecli.rollout.sample import Sample
from slimecli.train import stages
from slimecli.train.coordinator import Coordinator
from slimecli.train.losses import loss_weights
from slimecli.train.micro_batches import micro_batches, rank_micro_batches
from slimecli.train.policy import TorchPolicy
from slimecli.train.stages import RankContext, StageTimer, StepBatch, StepTensors

RTOL = 1e-4
TEMPERATURE = 0.7
CTX = RankContext(pad_id=0, micro_batch_size=2, temperature=TEMPERATURE, device=torch.device("cpu"))


class LMOutput(NamedTuple):  # a pytree node, so FSDP2 hooks the logits' backward (a SimpleNamespace is opaque)
    logits: torch.Tensor


class TinyLM(torch.nn.Module):
    """Logits from a causal running mean of token embeddings: a position sees only its prefix."""

    def __init__(self, seed: int, vocab: int = 12, hidden: int = 8):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                use_cache: bool = False) -> LMOutput:
        h = torch.tanh(self.embed(input_ids))
        steps = torch.arange(1, input_ids.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        return LMOutput(self.head(h.cumsum(1) / steps))


def torch_policy(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
      ctx: RankContext | None = None) -> TorchPolicy:
    """The torch back-end around a test model, at ctx's data rank."""
    ctx = ctx or CTX
    return TorchPolicy(model, optimizer, data_rank=ctx.rank, data_size=ctx.world_size)


def make_samples() -> list[Sample]:
    """Two prompts x two samples; sample 2 has a context token (mask 0) in its response."""
    return [
        Sample(index=0, group_index=0, tokens=[1, 2, 3, 4, 5], response_length=3,
               rollout_log_probs=[-2.0, -2.5, -1.5], teacher_log_probs=[-1.0, -1.2, -0.8]),
        Sample(index=1, group_index=0, tokens=[1, 2, 6, 7], response_length=2,
               rollout_log_probs=[-2.2, -2.4], teacher_log_probs=[-3.0, -2.0]),
        Sample(index=2, group_index=1, tokens=[3, 4, 8, 9, 10], response_length=3, loss_mask=[1, 0, 1],
               rollout_log_probs=[-2.1, 0.0, -2.6], teacher_log_probs=[-1.5, 0.0, -1.1]),
        Sample(index=3, group_index=1, tokens=[3, 4, 11, 2], response_length=2,
               rollout_log_probs=[-2.3, -2.0], teacher_log_probs=[-2.5, -2.8]),
    ]


REWARDS = [1.0, 0.0, 0.5, 0.0]


def make_batch(**sample_changes: dict[str, Any]) -> StepBatch:
    samples = make_samples()
    for i, changes in sample_changes.items():
        idx = int(i.removeprefix("s"))
        samples[idx] = dataclasses.replace(samples[idx], **changes)
    return StepBatch(samples, list(REWARDS), {"reward/mean": 0.375})


def make_cfg(optimizer: dict[str, Any] | None = None, **trainer: Any) -> SlimeConfig:
    base = SlimeConfig()
    t = dataclasses.replace(base.trainer, **{"global_batch_size": 4, "micro_batch_size": 2, **trainer})
    r = dataclasses.replace(base.rollout, batch_size=2, n_samples_per_prompt=2, temperature=TEMPERATURE)
    o = dataclasses.replace(base.optimizer, **(optimizer or {}))
    return dataclasses.replace(base, trainer=t, rollout=r, optimizer=o)


def direct_logp(model: torch.nn.Module, sample: Sample) -> list[float]:
    """Independent: one unpadded forward of the whole sequence, log-softmax at the temperature."""
    with torch.no_grad():
        logits = model(torch.tensor([sample.tokens])).logits[0] / TEMPERATURE
    start = len(sample.tokens) - sample.response_length
    logp = torch.log_softmax(logits[start - 1:-1], -1)
    return logp.gather(-1, torch.tensor(sample.tokens[start:]).view(-1, 1)).view(-1).tolist()


def flat(ts: list[torch.Tensor] | None) -> list[float]:
    assert ts is not None
    return [float(v) for t in ts for v in t.reshape(-1)]


def close(got: list[float], want: list[float], rtol: float = RTOL, atol: float = 1e-6) -> None:
    assert len(got) == len(want), (got, want)
    assert got == pytest.approx(want, rel=rtol, abs=atol), (got, want)


def direct_entropy(model: torch.nn.Module, sample: Sample) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([sample.tokens])).logits[0] / TEMPERATURE
    start = len(sample.tokens) - sample.response_length
    logp = torch.log_softmax(logits[start - 1:-1], -1)
    return (-(logp.exp() * logp).sum(-1)).tolist()


def whiten_by_hand(values: list[list[float]], masks: list[list[int]]) -> list[list[float]]:
    valid = [v for row, m in zip(values, masks, strict=True) for v, k in zip(row, m, strict=True) if k]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / len(valid)
    return [[(v - mean) / math.sqrt(var + 1e-8) if k else 0.0 for v, k in zip(row, m, strict=True)]
            for row, m in zip(values, masks, strict=True)]


# ---- rollout ------------------------------------------------------------------------------------------------
def test_rollout_stage_hands_the_collected_batch_to_every_rank():
    samples = make_samples()
    result = SimpleNamespace(samples=samples, train_rewards=list(REWARDS), metrics={"reward/mean": 0.375})
    batch = stages.rollout(SimpleNamespace(take=lambda step: result), 3)
    assert batch == StepBatch(samples, REWARDS, {"reward/mean": 0.375})
    assert stages.rollout(None, 3) is None  # a world of one without a rollout side: nothing to broadcast
    assert stages.rollout(Coordinator().rollouts, 3) is None  # a rank other than 0: its part takes nothing


# ---- old_logp -----------------------------------------------------------------------------------------------
OLD_LOGP = [-3.040399, -2.385517, -1.566945, -2.571432, -2.473761, -2.5498, -1.979433, -2.856889, -2.696611,
            -2.838921]


def test_old_logp_recomputed_for_several_updates():
    model, batch = TinyLM(0), make_batch()
    old = stages.old_logp(torch_policy(model), batch, make_cfg(global_batch_size=2).trainer, CTX, has_ref=False)
    assert [t.numel() for t in old] == [3, 2, 3, 2]
    close(flat(old), OLD_LOGP)
    close(flat(old), [v for s in batch.samples for v in direct_logp(model, s)])


def test_old_logp_none_on_policy_engine_values_when_asked():
    model, batch = TinyLM(0), make_batch()
    assert stages.old_logp(torch_policy(model), batch, make_cfg().trainer, CTX, has_ref=False) is None  # one update
    # KL reward shaping needs a base even with one update; TIS needs the recompute to compare with the engine
    close(flat(stages.old_logp(torch_policy(model), batch, make_cfg(kl_coef=0.1).trainer, CTX, has_ref=True)), OLD_LOGP)
    close(flat(stages.old_logp(torch_policy(model), batch, make_cfg(off_policy_correction="tis").trainer, CTX, has_ref=False)), OLD_LOGP)
    engine = stages.old_logp(torch_policy(model), batch, make_cfg(use_rollout_logprobs=True).trainer, CTX, has_ref=False)
    assert flat(engine) == pytest.approx([v for s in batch.samples for v in s.rollout_log_probs])


def test_old_logp_missing_engine_logprobs_is_an_error():
    batch = make_batch(s1={"rollout_log_probs": None})
    with pytest.raises(ValueError, match=r"sample 1 \(index 1\) has no engine log-probs.*trainer.use_rollout_logprobs"):
        stages.old_logp(torch_policy(TinyLM(0)), batch, make_cfg(use_rollout_logprobs=True).trainer, CTX, has_ref=False)
    short = make_batch(s2={"rollout_log_probs": [-1.0]})  # one value for three tokens is missing too
    with pytest.raises(ValueError, match=r"sample 2 .*got 1 values"):
        stages.old_logp(torch_policy(TinyLM(0)), short, make_cfg(use_rollout_logprobs=True).trainer, CTX, has_ref=False)


def test_scoring_shards_across_ranks_and_gathers_in_batch_order(monkeypatch):
    """Rank 0 of 2 scores samples 0 and 2; the all-gather brings rank 1's 1 and 3 back in place."""
    model, batch = TinyLM(0), make_batch()
    rank1 = stages.score(torch_policy(model), batch.samples[1::2], CTX)
    seen: list[int] = []

    def gather(mine: tuple[int, list[torch.Tensor]]) -> list[tuple[int, list[torch.Tensor]]]:
        seen.extend(t.numel() for t in mine[1])
        return [mine, (1, rank1)]

    monkeypatch.setattr(stages.dist, "all_gather_object", gather)
    got = stages.score(torch_policy(model), batch.samples, dataclasses.replace(CTX, rank=0, world_size=2))
    assert seen == [3, 3]  # samples 0 and 2 only
    close(flat(got), OLD_LOGP)


# ---- ref_logp -----------------------------------------------------------------------------------------------
REF_LOGP = [-2.980301, -2.351052, -2.02204, -1.718534, -3.29262, -3.232176, -3.288201, -2.203001, -2.678217,
            -2.232329]


def test_ref_logp_scores_the_frozen_reference():
    ref, batch = TinyLM(1), make_batch()
    got = stages.ref_logp(torch_policy(ref), batch, CTX)
    close(flat(got), REF_LOGP)
    close(flat(got), [v for s in batch.samples for v in direct_logp(ref, s)])
    assert stages.ref_logp(None, batch, CTX) is None


# ---- advantages ---------------------------------------------------------------------------------------------
GRPO = [0.707106, 0.707106, 0.707106, -0.707106, -0.707106, 0.707105, 0.707105, 0.707105, -0.707105, -0.707105]


def test_advantages_grpo_by_hand():
    out = stages.advantages(make_batch(), None, None, make_cfg().trainer, 2)
    close(flat(out.advantages), GRPO)
    # group 0: rewards 1, 0 -> centred +-0.5, unbiased std sqrt(0.5); group 1: 0.5, 0 -> +-0.25, std sqrt(0.125)
    g0, g1 = 0.5 / (math.sqrt(0.5) + 1e-6), 0.25 / (math.sqrt(0.125) + 1e-6)
    close(flat(out.advantages), [g0] * 3 + [-g0] * 2 + [g1] * 3 + [-g1] * 2)
    close(flat(out.returns), GRPO)


RPP = [1.001129, 1.211349, 1.452388, -1.017929, -1.262835, -0.027246, 0.0, 0.432973, -0.900451, -0.889378]
RPP_RETURNS = [0.782249, 0.862488, 0.954491, 0.011592, -0.081886, 0.389727, 0.50885, 0.565389, 0.056433, 0.060659]


def test_advantages_reinforce_plus_plus_with_kl_shaping():
    batch, cfg = make_batch(), make_cfg(advantage_estimator="reinforce_plus_plus", kl_coef=0.1, gamma=0.9).trainer
    old = stages.old_logp(torch_policy(TinyLM(0)), batch, cfg, CTX, has_ref=True)
    ref = stages.ref_logp(torch_policy(TinyLM(1)), batch, CTX)
    out = stages.advantages(batch, old, ref, cfg, 2)
    close(flat(out.advantages), RPP)
    close(flat(out.returns), RPP_RETURNS)
    # by hand: token reward -0.1 * (old - ref) on trainable tokens, the reward on the last one, discounted by 0.9
    want_returns, masks = [], []
    for s, r, o, f in zip(batch.samples, REWARDS, old, ref, strict=True):
        mask = s.effective_loss_mask()
        token = [-0.1 * (a - b) * k for a, b, k in zip(o.tolist(), f.tolist(), mask, strict=True)]
        token[max(i for i, k in enumerate(mask) if k)] += r
        g, row = 0.0, []
        for x in reversed(token):
            g = x + 0.9 * g
            row.insert(0, g)
        want_returns.append(row)
        masks.append(mask)
    close(flat(out.returns), [v for row in want_returns for v in row])
    close(flat(out.advantages), [v for row in whiten_by_hand(want_returns, masks) for v in row])


OPD = [0.736822, 1.112184, 0.36146, -1.515351, -0.013902, 0.236339, 0.0, 1.362426, -0.764627, -1.515351]


def test_advantages_opd_from_engine_and_teacher_logprobs():
    batch = make_batch()
    cfg = make_cfg(advantage_estimator="reinforce_plus_plus_baseline", opd_kl_coef=1.0, reward_coef=0.0).trainer
    out = stages.advantages(batch, None, None, cfg, 2)
    close(flat(out.advantages), OPD)
    # by hand: reward_coef 0 leaves -(student - teacher), student = the engine's log-probs; then whitening
    pre = [[-(a - b) for a, b in zip(s.rollout_log_probs, s.teacher_log_probs, strict=True)] for s in batch.samples]
    want = whiten_by_hand(pre, [s.effective_loss_mask() for s in batch.samples])
    close(flat(out.advantages), [v for row in want for v in row])


def test_advantages_opd_missing_logprobs_are_errors():
    cfg = make_cfg(opd_kl_coef=1.0).trainer
    with pytest.raises(ValueError, match=r"sample 2 \(index 2\) has no teacher log-probs.*opd_kl_coef"):
        stages.advantages(make_batch(s2={"teacher_log_probs": None}), None, None, cfg, 2)
    with pytest.raises(ValueError, match=r"sample 1 \(index 1\) has no engine log-probs.*opd_kl_coef \(the student\)"):
        stages.advantages(make_batch(s1={"rollout_log_probs": None}), None, None, cfg, 2)
    # recomputed old log-probs are the student: the engine's are not needed then, and not used where they are
    old = [torch.full((s.response_length,), -0.5) for s in make_samples()]
    got = stages.advantages(make_batch(s1={"rollout_log_probs": None}), old, None, cfg, 2).advantages
    with_engine = stages.advantages(make_batch(), old, None, cfg, 2).advantages
    engine_only = stages.advantages(make_batch(), None, None, cfg, 2).advantages
    plain = stages.advantages(make_batch(), None, None, make_cfg().trainer, 2).advantages
    for i, sample in enumerate(make_samples()):
        teacher = torch.tensor(sample.teacher_log_probs)
        expected = plain[i] - 1.0 * (old[i] - teacher)  # advantages - opd_kl_coef * (student - teacher)
        torch.testing.assert_close(got[i], expected, msg=f"sample {i}: the student is the recomputed log-probs")
        torch.testing.assert_close(with_engine[i], expected)
    assert not torch.allclose(engine_only[0], got[0])  # the engine's log-probs, where they are the student, differ


# ---- update -------------------------------------------------------------------------------------------------
def run_update(global_batch_size: int, ctx: RankContext = CTX, **trainer: Any
               ) -> tuple[TinyLM, dict[str, float], StepTensors]:
    model, batch = TinyLM(0), make_batch()
    cfg = make_cfg(global_batch_size=global_batch_size, micro_batch_size=1, **trainer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    old = stages.old_logp(torch_policy(model), batch, cfg.trainer, ctx, has_ref=False)
    tensors = StepTensors(old, None, stages.advantages(batch, old, None, cfg.trainer, 2))
    return model, stages.update(torch_policy(model, optimizer), scheduler, batch, tensors, cfg, ctx), tensors


CHECKSUM_ONE_UPDATE = (-8.78691, 79.336441)  # (row-weighted sum of the head, |embedding| sum) after the step
CHECKSUM_TWO_UPDATES = (-8.950356, 79.310577)


def checksum(model: TinyLM) -> tuple[float, float]:
    rows = torch.arange(1, 13, dtype=torch.float32).view(-1, 1)
    return float((model.head.weight.detach() * rows).sum()), float(model.embed.weight.detach().abs().sum())


def test_update_one_on_policy_update():
    model, metrics, tensors = run_update(4)
    assert metrics == pytest.approx({"train/pg_loss": 0.0, "train/pg_clipfrac": 0.0, "train/ppo_kl": 0.0,
                                     "train/entropy": 2.3716279, "train/loss": 0.0, "train/grad_norm": 0.4956819,
                                     "train/lr": 0.5, "train/updates": 1}, rel=RTOL, abs=1e-6)
    assert checksum(model) == pytest.approx(CHECKSUM_ONE_UPDATE, rel=RTOL)
    # independent: the weighted entropy, and the gradient of -sum(A * w * logp) on a fresh copy of the model
    fresh, samples = TinyLM(0), make_samples()
    weights = loss_weights(samples)
    entropy = sum(float((torch.tensor(direct_entropy(fresh, s)) * w).sum()) for s, w in zip(samples, weights, strict=True))
    assert metrics["train/entropy"] == pytest.approx(entropy, rel=RTOL)
    loss = torch.zeros(())
    for s, w, a in zip(samples, weights, tensors.advantages.advantages, strict=True):
        logits = fresh(torch.tensor([s.tokens])).logits[0] / TEMPERATURE
        start = len(s.tokens) - s.response_length
        logp = torch.log_softmax(logits[start - 1:-1], -1).gather(-1, torch.tensor(s.tokens[start:]).view(-1, 1))
        loss = loss - (a * w * logp.view(-1)).sum()
    loss.backward()
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in fresh.parameters()))
    assert metrics["train/grad_norm"] == pytest.approx(norm, rel=RTOL)



def test_update_two_updates_off_policy_second():
    model, metrics, _ = run_update(2)
    # the second update's ratio is no longer 1: ppo_kl and pg_loss move off zero
    assert metrics == pytest.approx({"train/pg_loss": 0.0009048, "train/pg_clipfrac": 0.0, "train/ppo_kl": 0.0208945,
                                     "train/entropy": 2.3526435, "train/loss": 0.0009048, "train/grad_norm": 0.6877893,
                                     "train/lr": 0.5, "train/updates": 2}, rel=RTOL, abs=1e-6)
    assert checksum(model) == pytest.approx(CHECKSUM_TWO_UPDATES, rel=RTOL)



def test_off_policy_stage_without_engine_logprobs_is_an_error():
    model, batch = TinyLM(0), make_batch(s3={"rollout_log_probs": None})
    cfg = make_cfg(off_policy_correction="tis")
    old = stages.old_logp(torch_policy(model), batch, cfg.trainer, CTX, has_ref=False)
    with pytest.raises(ValueError, match=r"sample 3 \(index 3\) has no engine log-probs.*off_policy_correction=tis"):
        stages.off_policy(batch, old, cfg.trainer, version=1)


# ---- sync_weights and save ----------------------------------------------------------------------------------
def test_sync_weights_pushes_the_whole_state_with_its_version():
    model, pushed = TinyLM(0), []
    sink = SimpleNamespace(push=lambda state, version: pushed.append((state, version)))
    state = stages.sync_weights(torch_policy(model), sink, 7, is_main=True)
    assert sorted(state) == ["embed.weight", "head.bias", "head.weight"]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert len(pushed) == 1 and pushed[0][0] is state and pushed[0][1] == 7
    assert stages.sync_weights(torch_policy(model), None, 8, is_main=False) is None  # other ranks hold no full copy


def test_save_writes_a_checkpoint_with_the_metrics_row(tmp_path):
    model = TinyLM(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = stages.sync_weights(torch_policy(model), None, 3, is_main=True)
    row = {"reward/mean": 0.375, "time/step_s": 0.25, "note": "kept as text"}
    path = stages.save(tmp_path, 3, torch_policy(model, optimizer), scheduler, state, make_cfg(), is_main=True,
                       data_position={"epoch": 0, "offset": 8}, metrics=row)
    ckpt = store.load(path)
    assert ckpt.step == 3 and ckpt.data_position == {"epoch": 0, "offset": 8}
    assert ckpt.metadata == {"optimizer": "adam", "metrics": row}
    assert all(torch.equal(ckpt.model_state[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="sync_weights"):
        stages.save(tmp_path, 4, torch_policy(model, optimizer), scheduler, None, make_cfg(), is_main=True)


def test_stage_timer_reports_every_stage():
    timer = StageTimer()
    with timer.stage("update"):
        pass
    assert list(timer.metrics()) == [f"time/{name}_s" for name in stages.STAGES]
    assert timer.metrics()["time/save_s"] == 0.0
    with pytest.raises(KeyError, match="stages: rollout"):
        with timer.stage("warmup"):
            pass


def test_resume_logs_the_metrics_row_a_kill_cut_off(tmp_path):
    """Killed after checkpoint step_3 but before its metrics line: the resume writes the row the checkpoint kept,
    once the evaluation of step 3 it lacks is in; a second resume finds the row and adds nothing."""
    import json

    from slimecli.train.records import StepRecords

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1}) + "\n" for s in (1, 2)))
    restored = {"reward/mean": 0.3, "time/save_s": 0.0}  # what the resume read from step_3
    records = StepRecords(tmp_path, max_steps=5, step=3, reward_key=None, restored_row=restored)
    assert records.awaits_evaluation(3)
    records.write_rows([], {3})  # its evaluation runs again
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    records.write_rows([(3, {"eval/x/reward_mean": 0.5, "eval/weight_version": 3})], set())
    records.close()
    again = StepRecords(tmp_path, max_steps=5, step=3, reward_key=None, restored_row=restored)
    assert not again.awaits_evaluation(3)
    again.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["reward/mean"] == 0.3
    assert rows[-1]["eval/weight_version"] == 3 and rows[-1]["eval/x/reward_mean"] == 0.5


def test_a_steps_row_waits_for_its_evaluation_and_the_rows_keep_their_order(tmp_path):
    """eval.at_start and eval.interval=1: the start's evaluation gets row 0, and each step's evaluation its own
    step's row, even when two land together (the last step's wait); a row waiting holds the rows after it, and
    keeps the time its step ended."""
    import json

    from slimecli.train.records import StepRecords

    def evaluation(step: int) -> tuple[int, dict]:
        return step, {"eval/x/reward_mean": step / 10, "eval/weight_version": step}

    records = StepRecords(tmp_path, max_steps=3, step=0, reward_key=None, restored_row=None)
    assert records.awaits_evaluation(0)
    batch = make_batch(s0={"reward": 1.0})
    written = lambda: [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    for step, (landed, awaiting) in enumerate([([], {0, 1}), ([evaluation(0)], {1, 2}),
                                               ([evaluation(1), evaluation(2), evaluation(3)], set())], start=1):
        records.log(step, records.row(step, batch, {}, {}, StageTimer(), time.perf_counter()), StageTimer(), batch, "")
        ended = time.time()
        records.write_rows(landed, awaiting)
        if step == 1:
            assert written() == []  # row 0's evaluation, and row 1's own, are still out
            time.sleep(0.05)
        if step == 2:
            assert [r["step"] for r in written()] == [0]
    records.close()
    rows = written()
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["eval/weight_version"] for r in rows] == [0, 1, 2, 3]
    assert [r["eval/x/reward_mean"] for r in rows] == [0.0, 0.1, 0.2, 0.3]
    assert "reward/mean" not in rows[0] and all(r["reward/mean"] == batch.metrics["reward/mean"] for r in rows[1:])
    assert rows[1]["time"] < rows[2]["time"] <= round(ended, 3) + 0.001  # row 1: when step 1 ended, not written


def test_a_row_still_waiting_when_the_run_fails_is_written_without_its_evaluation(tmp_path):
    import json

    from slimecli.train.records import StepRecords

    records = StepRecords(tmp_path, max_steps=3, step=0, reward_key=None, restored_row=None)
    batch = make_batch(s0={"reward": 1.0})
    records.log(1, records.row(1, batch, {}, {}, StageTimer(), time.perf_counter()), StageTimer(), batch, "")
    records.write_rows([], {1})
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    records.close()  # the evaluation of step 1 was dropped with the run
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["reward/mean"] == batch.metrics["reward/mean"] and "eval/weight_version" not in row


def test_the_records_row_is_built_before_the_save_and_logged_with_its_time(tmp_path, capsys):
    """Rank 0's records: the row the checkpoint keeps has the step's metrics and times but the stages', which
    the log line adds with the save's; an invalid reward is counted on the progress line."""
    import json

    from slimecli.train.records import StepRecords

    records = StepRecords(tmp_path, max_steps=2, step=0, reward_key=None, restored_row=None)
    batch = make_batch(s0={"reward": 1.0}, s1={"reward": 0.0}, s2={"reward": 0.5}, s3={"reward": "not a number"})
    timer = StageTimer()
    timer.seconds.update(old_logp=1.0, update=2.0, rollout=4.0)
    row = records.row(1, batch, {"train/loss": 0.5}, {"eval/x/reward_mean": 0.25}, timer, started=0.0)
    assert row["time/train_s"] == 3.0 and row["weight_version"] == 1 and row["train/loss"] == 0.5
    assert row["reward/mean"] == 0.375 and row["eval/x/reward_mean"] == 0.25 and "time/save_s" not in row
    assert row["perf/tokens_per_s"] == pytest.approx(10 / row["time/step_s"])
    timer.seconds["save"] = 0.5
    records.log(1, row, timer, batch, "eval x 0.250")
    records.close()
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["step"] == 1 and logged["time/save_s"] == 0.5 and logged["time/rollout_s"] == 4.0
    line = capsys.readouterr().out
    assert "step reward 0.375" in line and "(1 invalid rewards so far)" in line and "| eval x 0.250" in line


# ---- ragged updates over ranks ------------------------------------------------------------------------------
def forked_batch() -> StepBatch:
    """Three agent runs, the first forked into two branches and the third into two: five samples, one update."""
    samples = make_samples() + [Sample(index=4, group_index=1, tokens=[3, 4, 5, 6], response_length=2,
                                       rollout_log_probs=[-2.0, -2.0])]
    for s, rid in zip(samples, [1, 1, 2, 3, 3], strict=True):
        s.rollout_id = rid
    return StepBatch(samples, [1.0, 1.0, 0.0, 0.5, 0.5], {})


def ragged_update(rank: int, world_size: int, port: int, tensors: StepTensors, out: Any, max_tokens: int | None
                  ) -> None:
    import os
    import sys

    import torch.distributed as torch_dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(TinyLM(0))
        cfg = make_cfg(global_batch_size=3, micro_batch_size=1, loss_reduction="per_rollout")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        ctx = dataclasses.replace(CTX, micro_batch_size=1, rank=rank, world_size=world_size, max_tokens=max_tokens)
        scored = flat(stages.score(torch_policy(model, None, ctx), make_samples(), ctx))
        metrics = stages.update(torch_policy(model, optimizer, ctx), scheduler, forked_batch(), tensors, cfg, ctx)
        state = {k: v.full_tensor() for k, v in model.state_dict().items()}
        if rank == 0:
            out.put((metrics, {k: v.tolist() for k, v in state.items()}, scored))
        del model, optimizer, scheduler
    finally:
        torch_dist.destroy_process_group()
    # The result is out. Leave without the interpreter's teardown: a spawned child that held FSDP2's
    # DTensors over gloo can abort there ("terminate called without an active exception") now and then,
    # which is torch's clean-up racing its own threads, not the update this test checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_rank_micro_batches_pad_every_rank_to_the_busiest():
    assert rank_micro_batches([5] * 5, 2, 1, None) == [[[0], [2], [4]], [[1], [3], []]]
    assert rank_micro_batches([5] * 5, 2, 2, None) == [[[0, 2], [4]], [[1, 3], []]]
    assert rank_micro_batches([5], 2, 4, None) == [[[0]], [[]]]


def test_a_token_budget_puts_long_samples_together_and_many_short_ones_in_one_micro_batch():
    lengths = [10, 80, 12, 10, 80, 11, 12, 10]  # a long tail: 2 of 8 samples 8x as long
    assert micro_batches(lengths, 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # 8 rows x 80 padded tokens
    assert micro_batches(lengths, 4, 160) == [[0, 2, 3, 5, 6, 7], [1, 4]]  # 6 x 12 and 2 x 80
    assert micro_batches(lengths, 4, 100) == [[0, 2, 3, 5, 6, 7], [1], [4]]
    # filled shortest first: two micro-batches either way, but none of the short samples is padded to 8
    # (filled longest first: [8, 8, 3] and five 3s, 39 padded tokens against 34)
    assert micro_batches([8, 8, 3, 3, 3, 3, 3, 3], 4, 24) == [[2, 3, 4, 5, 6, 7], [0, 1]]
    assert micro_batches([300, 10], 4, 100) == [[1], [0]]  # a sample over the budget goes alone
    assert micro_batches([], 4, 100) == []
    # every rank computes every rank's micro-batches, and pads its own to the busiest's count
    assert rank_micro_batches(lengths, 2, 4, 100) == [[[0, 2, 6], [4]], [[3, 5, 7], [1]]]
    assert rank_micro_batches([80, 10, 10, 10], 2, 4, 100) == [[[2], [0]], [[1, 3], []]]


def test_a_token_budget_changes_no_log_prob_and_no_update():
    """The pinned values of the fixed micro-batches, with the samples regrouped by a budget of 9 padded tokens
    (micro-batches [1, 3], [0] and [2])."""
    budget = dataclasses.replace(CTX, max_tokens=9)
    assert budget.rank_micro_batches(make_samples()) == [[[1, 3], [0], [2]]]
    model, batch = TinyLM(0), make_batch()
    old = stages.old_logp(torch_policy(model), batch, make_cfg(global_batch_size=2).trainer, budget, has_ref=False)
    close(flat(old), OLD_LOGP)
    model, metrics, _ = run_update(4, ctx=budget)
    assert metrics["train/grad_norm"] == pytest.approx(0.4956819, rel=RTOL)
    assert checksum(model) == pytest.approx(CHECKSUM_ONE_UPDATE, rel=RTOL)


@pytest.mark.parametrize("max_tokens", [None, 9])
def test_fsdp_update_with_forked_runs_matches_one_process(max_tokens):
    """Ranks get 3 and 2 samples of one update (forked agent runs); FSDP ranks stay in step (no hang) and the
    weights after the update equal a single process's. With a token budget of 9 the ranks' micro-batches differ in
    count too (3 and 1 for the update, 2 and 1 for the sharded scoring): the lighter rank runs fillers."""
    import torch.multiprocessing as mp

    from tests.helpers import free_port, wait_until

    cfg = make_cfg(global_batch_size=3, micro_batch_size=1, loss_reduction="per_rollout")
    batch = forked_batch()
    assert stages.update_slices(batch.samples, cfg.trainer) == [[0, 1, 2, 3, 4]]
    single = TinyLM(0)
    tensors = StepTensors(None, None, stages.advantages(batch, None, None, cfg.trainer, 2))
    optimizer = torch.optim.SGD(single.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    want = stages.update(torch_policy(single, optimizer), scheduler, forked_batch(), tensors, cfg,
                         dataclasses.replace(CTX, micro_batch_size=1))

    queue = mp.get_context("spawn").SimpleQueue()
    ctx = mp.spawn(ragged_update, args=(2, free_port(), tensors, queue, max_tokens), nprocs=2, join=False)
    wait_until(lambda: ctx.join(timeout=1), 120, "both ranks to finish the update (they hung)", interval=0)
    metrics, state, scored = queue.get()
    close(scored, OLD_LOGP)  # make_samples() scored by the two ranks, before the update
    for name, value in single.state_dict().items():
        close(flat([torch.tensor(state[name])]), flat([value]))
    assert metrics["train/updates"] == 1
    assert metrics["train/entropy"] == pytest.approx(want["train/entropy"], rel=RTOL)
