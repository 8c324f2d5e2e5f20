"""One training step as named stages, the way verl's ``fit()`` names them:

    rollout -> old_logp -> ref_logp -> advantages -> update -> sync_weights -> eval -> save

Each stage is a function with explicit inputs and outputs, so it can be tested on a fixed batch, and each
is timed into the step's metrics as ``time/<stage>_s`` (``StageTimer``). loop.py only orchestrates.

Per-sample quantities are lists with one 1-D float tensor per sample (``response_length`` long).
Scoring (old and reference log-probs) is sharded: every data rank scores its own samples and the results are
all-gathered, so the advantage stage sees the whole batch on every rank. The model work goes through a
PolicyBackend (backend.py), so the stages are the same for trainer=torch and trainer=megatron.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from slimecli.config.groups.trainer import TrainerConfig
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import route, run_teachers
from slimecli.rollout.sample import Sample, version_number
from slimecli.train import advantages as adv_lib
from slimecli.train import dist
from slimecli.train.backend import PolicyBackend
from slimecli.train.batch import PackedBatch, pack
from slimecli.train.losses import kl_penalty, loss_weights, pad_sequences, policy_loss
from slimecli.train.micro_batches import rank_micro_batches

STAGES = ("rollout", "old_logp", "ref_logp", "advantages", "update", "sync_weights", "eval", "save")

Tensors = list[torch.Tensor]


@dataclass
class StepBatch:
    """What every rank receives from rank 0 after a rollout."""

    samples: list[Sample]
    rewards: list[float]
    metrics: dict[str, Any]


@dataclass
class StepTensors:
    """What the scoring and advantage stages hand to the update, one tensor per sample."""

    old_logp: Tensors | None  # None: on-policy, the update uses its own log-probs, detached
    ref_logp: Tensors | None  # None: no reference model
    advantages: adv_lib.Advantages
    is_weights: Tensors | None = None  # trainer.off_policy_correction's per-token importance weights


@dataclass(frozen=True)
class RankContext:
    """This rank's place among the data ranks (model replicas) and how samples are packed for a forward."""

    pad_id: int
    micro_batch_size: int
    temperature: float  # log-probs are taken at the rollout temperature
    device: torch.device
    rank: int = 0
    world_size: int = 1
    max_tokens: int | None = None  # trainer.max_tokens_per_micro_batch: micro-batches by padded tokens (micro_batches.py)

    def rank_micro_batches(self, samples: Sequence[Sample], world_size: int | None = None) -> list[list[list[int]]]:
        """Every data rank's micro-batches of ``samples`` (split rank, rank + world, ...), as positions into it."""
        return rank_micro_batches([len(s.tokens) for s in samples], world_size or self.world_size,
                                  self.micro_batch_size, self.max_tokens)


class RolloutSource(Protocol):
    def take(self, step: int) -> Any: ...  # .samples, .train_rewards, .metrics; None on a rank that only receives


class WeightTarget(Protocol):
    def push(self, state: dict[str, torch.Tensor], version: int) -> Any: ...


class StageTimer:
    """Wall time of each stage of one step; every stage is reported (0 when it did not run this step)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if name not in self.seconds:
            raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count ``seconds`` timed inside stage ``source`` as stage ``target``'s."""
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def metrics(self) -> dict[str, float]:
        return {f"time/{name}_s": s for name, s in self.seconds.items()}


# ---- log-probs -----------------------------------------------------------------------------------------
@torch.no_grad()
def score(policy: PolicyBackend, samples: Sequence[Sample], ctx: RankContext) -> Tensors:
    """Per-sample response log-probs (no gradient) of the whole batch, each data rank scoring only its shard.

    Data rank r scores samples r, r + n, ... (the samples it trains on), micro-batched; an all-gather
    puts the batch back together. A batch that does not split evenly is scored whole on every rank, so
    that FSDP ranks run the same number of forwards.
    """
    sharded = ctx.world_size > 1 and len(samples) % ctx.world_size == 0
    chunks = ctx.rank_micro_batches(samples, ctx.world_size if sharded else 1)[ctx.rank if sharded else 0]
    # a rank with fewer micro-batches than the busiest scores its first sample again, and drops it
    packs = [pack([samples[i] for i in chunk or [ctx.rank]], ctx.pad_id).to(ctx.device) for chunk in chunks]
    scored = policy.score(packs, ctx.temperature)
    by_position = {i: logp[j, :samples[i].response_length].float().cpu()
                   for chunk, logp in zip(chunks, scored, strict=True) for j, i in enumerate(chunk)}
    if not sharded:
        return [by_position[i] for i in range(len(samples))]
    mine = [by_position[i] for i in range(ctx.rank, len(samples), ctx.world_size)]
    shards = dist.gather_by_data_rank(mine, ctx.rank, ctx.world_size)
    return [shards[i % ctx.world_size][i // ctx.world_size] for i in range(len(samples))]


def engine_log_probs(samples: Sequence[Sample], needed_by: str) -> Tensors:
    """The engine's per-token log-probs of every sample; a sample without them is an error, never zeros."""
    out = []
    for i, s in enumerate(samples):
        lp = s.rollout_log_probs
        if lp is None or len(lp) != s.response_length:
            got = "none" if lp is None else f"{len(lp)} values"
            raise ValueError(f"sample {i} (index {s.index}) has no engine log-probs for its {s.response_length} "
                             f"response tokens (got {got}); {needed_by} needs them: the engine must return "
                             "log-probs (return_logprob) for every sampled token")
        out.append(torch.tensor(lp, dtype=torch.float32))
    return out


def n_updates(n_samples: int, cfg: TrainerConfig) -> int:
    return n_samples // cfg.global_batch_size


def update_slices(samples: Sequence[Sample], cfg: TrainerConfig) -> list[list[int]]:
    """Batch positions of each optimizer update: trainer.global_batch_size rollouts per update.

    A rollout is the samples sharing a rollout_id (an agent run's branches) or one sample; every rollout lies in
    one update with all its samples, so that none is left untrained and the per-rollout loss sees it whole.
    """
    keys = adv_lib.rollout_keys(samples)
    rollouts: dict[int, list[int]] = {}
    for pos, key in enumerate(keys):
        rollouts.setdefault(key, []).append(pos)
    members = list(rollouts.values())
    gbs = cfg.global_batch_size
    return [[p for r in members[u * gbs:(u + 1) * gbs] for p in r] for u in range(len(members) // gbs)]


def update_weights(samples: Sequence[Sample], cfg: SlimeConfig) -> Tensors:
    """The loss weights of one update's samples (trainer.loss_reduction; token_sum_norm by rollout.max_new_tokens)."""
    return loss_weights(samples, cfg.trainer.loss_reduction, norm_tokens=cfg.rollout.max_new_tokens)


# ---- the stages ---------------------------------------------------------------------------------------------
def rollout(source: RolloutSource | None, step: int) -> StepBatch:
    """Rank 0 takes step ``step``'s rollout (elsewhere ``source`` is None or takes nothing); every rank gets the
    same StepBatch."""
    result = source.take(step) if source is not None else None
    batch = StepBatch(result.samples, result.train_rewards, result.metrics) if result is not None else None
    # rank 0 holds the source in a trainer, so what it sends is a StepBatch
    return cast(StepBatch, dist.broadcast_object(batch))


def staleness(batch: StepBatch, version: int, max_staleness: int) -> dict[str, float]:
    """How many weight versions behind ``version`` (the weights about to be trained) each sample was begun; a
    sample further behind than ``max_staleness`` stays in the batch with no loss (remove_sample).

    A sample counts by its oldest token: the per-token versions where the engine reported them, else the
    weight_version of each generation call ("default", the weights before the first update, is version 0)."""
    gaps = []
    for sample in batch.samples:
        versions = [v for v in sample.token_versions or [] if v >= 0]
        if not versions:
            versions = [v for v in map(version_number, sample.weight_versions) if v >= 0]
        if not versions:
            continue
        gap = version - min(versions)
        gaps.append(gap)
        if gap > max_staleness:
            sample.remove_sample = True
    return {"rollout/staleness_max": float(max(gaps, default=0)),
            "rollout/staleness_mean": sum(gaps) / len(gaps) if gaps else 0.0,
            "rollout/stale_dropped": float(sum(g > max_staleness for g in gaps))}


def old_logp(policy: PolicyBackend, batch: StepBatch, cfg: TrainerConfig, ctx: RankContext, *,
             has_ref: bool) -> Tensors | None:
    """The behaviour policy's log-probs, when something needs them; None means on-policy (one update).

    Engine log-probs with trainer.use_rollout_logprobs, else a recompute with the current weights when the
    step makes several updates, for trainer.off_policy_correction (with trainer.async_rollout: the weights some
    versions ahead of those that sampled the batch, so the correction weighs the gap; decoupled PPO's proximal
    policy), or as the base of KL reward shaping.
    """
    if cfg.use_rollout_logprobs:
        return engine_log_probs(batch.samples, "trainer.use_rollout_logprobs")
    needed = (len(update_slices(batch.samples, cfg)) > 1 or cfg.off_policy_correction != "none"
              or (cfg.kl_coef != 0 and has_ref))
    return score(policy, batch.samples, ctx) if needed else None


def ref_logp(ref: PolicyBackend | None, batch: StepBatch, ctx: RankContext) -> Tensors | None:
    """The frozen reference's log-probs (KL loss or KL reward shaping); None without a reference."""
    return score(ref, batch.samples, ctx) if ref is not None else None


def advantages(batch: StepBatch, old: Tensors | None, ref: Tensors | None, cfg: TrainerConfig,
               n_samples_per_prompt: int, values: Tensors | None = None,
               opd_coefs: Sequence[float] | None = None) -> adv_lib.Advantages:
    """Advantages of every sample, with KL reward shaping (trainer.kl_coef) and the OPD term when configured;
    ``values``: the critic's, for trainer.advantage_estimator=gae; ``opd_coefs``: each sample's OPD coefficient,
    by its teacher (None: trainer.opd_kl_coef for all)."""
    kl_shaping = None
    if cfg.kl_coef != 0 and ref is not None:
        if old is None:
            raise ValueError("KL reward shaping needs the old log-probs: the old_logp stage computes them")
        kl_shaping = [kl_penalty(b, r, "k1") for b, r in zip(old, ref, strict=True)]
    student = None
    if any(opd_coefs) if opd_coefs is not None else cfg.opd_kl_coef:
        student = old if old is not None else engine_log_probs(batch.samples, "trainer.opd_kl_coef (the student)")
    return adv_lib.compute_advantages(batch.samples, batch.rewards, cfg, n_samples_per_prompt, kl=kl_shaping,
                                      student_logp=student, values=values, opd_coefs=opd_coefs)


def opd_coefs(cfg: SlimeConfig, samples: Sequence[Sample]) -> list[float] | None:
    """Each sample's OPD coefficient: its teacher's opd_kl_coef (config/teachers.py), by the teacher that scored
    it, else by its route; None without teachers (trainer.opd_kl_coef then)."""
    coefs = {t.name: t.opd_kl_coef for t in run_teachers(cfg)}
    if not coefs:
        return None
    return [coefs.get(s.teacher or "", coefs.get(route(cfg, s.metadata.get("source")), cfg.trainer.opd_kl_coef))
            for s in samples]


def overlong(batch: StepBatch, cfg: SlimeConfig) -> tuple[StepBatch, dict[str, float]]:
    """The batch with DAPO's overlong penalty in its rewards (trainer.overlong_buffer > 0), and its metrics; the
    batch itself when it is off (its rewards stay the logged task rewards)."""
    from slimecli.train.shaping import shape_rewards

    t = cfg.trainer
    if t.overlong_buffer == 0:
        return batch, {}
    rewards, metrics = shape_rewards(batch.rewards, [s.response_length for s in batch.samples],
                                     cfg.rollout.max_new_tokens, t.overlong_buffer, t.overlong_penalty)
    return StepBatch(batch.samples, rewards, batch.metrics), metrics


def off_policy(batch: StepBatch, old: Tensors | None, cfg: TrainerConfig, version: int
               ) -> tuple[Tensors | None, dict[str, float]]:
    """trainer.off_policy_correction's importance weights (None: none) and the off_policy/* metrics of the batch
    about to train the weights of ``version``: the share of its tokens sampled by older weights, the KL between
    the engine's log-probs (each from the version that sampled its token) and the trainer's, and the share of
    tokens the correction clipped or masked."""
    from slimecli.train import off_policy as op
    from slimecli.train.registry import get_off_policy_correction

    samples = batch.samples
    masks = [torch.tensor(s.effective_loss_mask(), dtype=torch.float32) for s in samples]
    trained = [[v for v, m in zip(s.token_versions or [], mask, strict=False) if m] for s, mask in zip(
        samples, masks, strict=True)]
    versions = [v for vs in trained for v in vs if v >= 0]
    metrics = {"off_policy/old_token_share": sum(v < version for v in versions) / len(versions) if versions else 0.0}
    correcting = cfg.off_policy_correction != "none"
    if not correcting and (old is None or any(s.rollout_log_probs is None for s in samples)):
        return None, metrics
    behaviour = engine_log_probs(samples, f"trainer.off_policy_correction={cfg.off_policy_correction}")
    if old is None:
        raise ValueError(f"trainer.off_policy_correction={cfg.off_policy_correction} needs the old log-probs: the "
                         "old_logp stage computes them")
    mask = pad_sequences(masks)
    old_t, behaviour_t = pad_sequences(old), pad_sequences(behaviour)
    metrics["off_policy/mismatch_kl"] = float(op.mismatch_kl(old_t, behaviour_t, mask))
    if not correcting:
        return None, metrics
    correction = get_off_policy_correction(cfg.off_policy_correction).fn(old_t, behaviour_t, mask, cfg)
    tokens = mask.sum().clamp(min=1)
    metrics["off_policy/is_weight_mean"] = float((correction.weights * mask).sum() / tokens)
    metrics["off_policy/clipped_frac"] = float(correction.clipped.float().sum() / tokens)
    metrics["off_policy/masked_frac"] = float(correction.masked.float().sum() / tokens)
    weights = [correction.weights[i, :s.response_length].float() for i, s in enumerate(samples)]
    return weights, metrics


def update_chunks(samples: list[Sample], idx: list[int], cfg: SlimeConfig, ctx: RankContext
                  ) -> tuple[Tensors, list[tuple[list[int], bool]], list[PackedBatch]]:
    """One optimizer update's share of this rank (the policy's and the critic's alike): every sample's loss
    weights (those of ``idx``, the update's samples, set), this rank's micro-batch chunks as (indices, filler),
    and their packed batches. A rank that ran out of samples runs a weightless filler chunk: FSDP ranks stay in
    step."""
    step_weights: Tensors = [torch.zeros(0)] * len(samples)
    for k, w in zip(idx, update_weights([samples[i] for i in idx], cfg), strict=True):
        step_weights[k] = w
    mine = ctx.rank_micro_batches([samples[i] for i in idx])[ctx.rank]
    chunks = [([idx[j] for j in chunk] or idx[:1], not chunk) for chunk in mine]
    packs = [pack([samples[i] for i in chunk], ctx.pad_id).to(ctx.device) for chunk, _ in chunks]
    return step_weights, chunks, packs


def update(policy: PolicyBackend, scheduler: Any, batch: StepBatch, tensors: StepTensors, cfg: SlimeConfig,
           ctx: RankContext) -> dict[str, float]:
    """One optimizer update per trainer.global_batch_size rollouts (update_slices), over this data rank's
    micro-batches; the step's metrics."""
    t = cfg.trainer
    samples = batch.samples
    slices = update_slices(samples, t)
    updates = len(slices)
    sums: dict[str, float] = {}
    grad_norms = []
    for idx in slices:
        step_weights, chunks, packs = update_chunks(samples, idx, cfg, ctx)

        def loss_fn(c: int, logp: torch.Tensor, entropy: torch.Tensor | None, idx: list[int] = idx,
                    chunks: list[tuple[list[int], bool]] = chunks, packs: list[PackedBatch] = packs,
                    step_weights: Tensors = step_weights) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            chunk, filler = chunks[c]
            width = packs[c].targets.shape[1]

            def rows(values: Tensors) -> torch.Tensor:
                return pad_to(pad_sequences([values[i] for i in chunk]), width).to(logp.device)

            loss, metrics = policy_loss(
                logp, rows(tensors.old_logp) if tensors.old_logp is not None else logp.detach(),
                rows(tensors.advantages.advantages), rows(step_weights), t, mask=packs[c].mask.to(logp.device),
                entropy=entropy, ref_logp=rows(tensors.ref_logp) if tensors.ref_logp is not None else None,
                is_weights=rows(tensors.is_weights) if tensors.is_weights is not None else None)
            return (loss * 0.0, {k: v * 0.0 for k, v in metrics.items()}) if filler else (loss, metrics)

        for metrics in policy.forward_backward(packs, ctx.temperature, loss_fn, entropy_grad=t.entropy_coef != 0):
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + float(value)
        grad_norms.append(policy.optimizer_step(cfg))
    out = {f"train/{k}": v / max(updates, 1) for k, v in dist.all_reduce_sum(sums).items()}
    out["train/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
    out["train/lr"] = scheduler.get_last_lr()[0]
    scheduler.step()  # the lr schedule counts training steps, like trainer.max_steps
    out["train/updates"] = updates
    return out


def sync_weights(policy: PolicyBackend, target: WeightTarget | None, version: int,
                 is_main: bool) -> dict[str, torch.Tensor] | None:
    """Gather the weights (a collective when sharded) and give them to the engines; rank 0 gets them back."""
    state = policy.full_state_dict(is_main)
    if target is not None and state is not None:
        target.push(state, version)
    return state


def save(run_dir: Path, step: int, policy: PolicyBackend, scheduler: Any,
         model_state: dict[str, torch.Tensor] | None, cfg: SlimeConfig, *, is_main: bool,
         data_position: Any = None, metrics: dict[str, Any] | None = None,
         critic_state: dict[str, Any] | None = None) -> Path | None:
    """A checkpoint of step ``step`` (every rank calls: the optimizer state is a collective when sharded).

    ``metrics``: the step's metrics row, kept in the checkpoint so a resume can log it if a kill came
    between the save and the metrics line. ``critic_state``: trainer.critic's (rank 0's). Returns the checkpoint
    directory on rank 0.
    """
    from slimecli.checkpoint import store
    from slimecli.checkpoint.layout import sharded_dir
    from slimecli.train.optim.build import keeps_optimizer_state

    keeps_state = keeps_optimizer_state(cfg.optimizer)
    target = sharded_dir(run_dir, step)  # None below: a back-end without its own sharded format
    sharded = target if policy.save_sharded(target, with_optimizer=keeps_state) else None
    optimizer_state = policy.optimizer_state(is_main) if keeps_state and sharded is None else None
    path = None
    if is_main:
        if model_state is None:
            raise ValueError("rank 0 saves the gathered model state: pass sync_weights' result")
        metadata: dict[str, Any] = {"optimizer": cfg.optimizer.name}
        if metrics is not None:
            from slimecli.observe.metrics import to_json_value

            metadata["metrics"] = to_json_value(metrics)
        path = store.save(run_dir, step, model_state, optimizer_state=optimizer_state,
                               scheduler_state=scheduler.state_dict(), data_position=data_position,
                               metadata=metadata, keep=cfg.trainer.keep_checkpoints, sharded=sharded,
                               critic_state=critic_state)
    dist.barrier()
    return path


def pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """[B, n] cut or right-padded with zeros to [B, width]."""
    if t.shape[1] >= width:
        return t[:, :width]
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))
