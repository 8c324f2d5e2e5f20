"""The torch trainer: rank 0 drives rollout, every rank trains on its share, rank 0 syncs weights.

One step = one rollout (rollout.batch_size prompts x n samples) followed by
samples / trainer.global_batch_size optimizer updates, then a weight push to the engines.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.rollout.sample import Sample
from slimecli.train import advantages as adv_lib
from slimecli.train import dist
from slimecli.train.batch import PackedBatch, pack
from slimecli.train.losses import (
    entropy_from_logits,
    kl_penalty,
    log_probs_from_logits,
    loss_weights,
    pad_sequences,
    policy_loss,
)
from slimecli.train.policy import (
    full_optimizer_state,
    full_state_dict,
    load_full_optimizer_state,
    load_full_state_dict,
    load_policy,
    no_sync_unless,
    response_logits,
    unwrap,
)

log = logging.getLogger("slimecli.train")


@dataclass
class StepBatch:
    """What every rank receives from rank 0 after a rollout."""

    samples: list[Sample]
    rewards: list[float]
    metrics: dict[str, Any]


class Trainer:
    def __init__(self, cfg: SlimeConfig, run_dir: Path):
        from slimecli.model.loading import load_tokenizer
        from slimecli.train.optim.build import build_optimizer, build_scheduler

        self.cfg = cfg
        self.run_dir = run_dir
        self.info = dist.init(cfg.trainer.dist_backend)
        torch.manual_seed(cfg.run.seed + self.info.rank)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.model = load_policy(cfg, self.info)
        needs_ref = cfg.trainer.kl_loss_coef != 0 or cfg.trainer.kl_coef != 0
        self.ref_model = load_policy(cfg, self.info, trainable=False) if needs_ref else None
        self.optimizer = build_optimizer(unwrap(self.model).named_parameters(), cfg.optimizer)
        self.scheduler = build_scheduler(self.optimizer, cfg.optimizer, cfg.trainer.max_steps)
        self.step = 0  # completed steps
        self.rollout = None
        if self.info.is_main:
            from slimecli.train.rank0 import RolloutSide

            self.rollout = RolloutSide(cfg, run_dir, self.tokenizer)

    # ---- the run ----------------------------------------------------------------------------------
    def run(self) -> None:
        from slimecli.observe.metrics import MetricsLogger
        from slimecli.observe.progress import StepProgress
        from slimecli.reward.stats import RewardMeter

        cfg = self.cfg
        resumed = self._resume()
        metrics_log = progress = None
        meter = RewardMeter(cfg.reward.key)
        if self.info.is_main:
            assert self.rollout is not None
            self.rollout.wait_ready()
        if resumed:  # the engines start from model.path; give them the resumed weights
            self._push_weights()
        if self.info.is_main:
            metrics_log = MetricsLogger(self.run_dir, resume_step=self.step)
            progress = StepProgress(cfg.trainer.max_steps, self.step)
        try:
            while self.step < cfg.trainer.max_steps:
                started = time.perf_counter()
                batch = self._rollout_batch()
                rollout_s = time.perf_counter() - started
                train_started = time.perf_counter()
                metrics = self._train_on(batch)
                train_s = time.perf_counter() - train_started
                self.step += 1
                state = self._push_weights()
                if self.info.is_main:
                    assert self.rollout is not None and metrics_log is not None and progress is not None
                    meter.update(batch.samples)
                    tokens = sum(s.response_length for s in batch.samples)
                    step_s = time.perf_counter() - started
                    metrics_log.log(self.step, {**batch.metrics, **metrics, "time/step_s": step_s,
                                                "time/rollout_s": rollout_s, "time/train_s": train_s,
                                                "perf/tokens_per_s": tokens / step_s, "weight_version": self.step})
                    progress.update(self.step, _progress_text(batch.metrics.get("reward/mean"), meter.postfix()))
                if self._should_save():
                    self._save(state)
            self._export_final()
        finally:
            if progress is not None:
                progress.close()
            if metrics_log is not None:
                metrics_log.close()
            if self.rollout is not None:
                self.rollout.close()
        dist.barrier()

    def _rollout_batch(self) -> StepBatch:
        batch = None
        if self.info.is_main:
            assert self.rollout is not None
            result = self.rollout.collect()
            batch = StepBatch(result.samples, result.train_rewards, result.metrics)
        return dist.broadcast_object(batch)

    def _should_save(self) -> bool:
        interval = self.cfg.trainer.save_interval
        return self.step == self.cfg.trainer.max_steps or (interval > 0 and self.step % interval == 0)

    def _push_weights(self) -> dict[str, torch.Tensor] | None:
        """Gather the weights (a collective under FSDP) and give them to the engines; rank 0 gets them back."""
        state = full_state_dict(self.model, self.info.is_main)
        if self.rollout is not None and state is not None:
            self.rollout.push_weights(state, self.step)
        return state

    def _save(self, model_state: dict[str, torch.Tensor] | None) -> None:
        from slimecli.train import checkpoint
        from slimecli.train.optim.build import keeps_optimizer_state

        keeps_state = keeps_optimizer_state(self.cfg.optimizer)
        optimizer_state = full_optimizer_state(self.model, self.optimizer, self.info.is_main) if keeps_state else None
        if self.info.is_main:
            assert self.rollout is not None and model_state is not None
            checkpoint.save(self.run_dir, self.step, model_state,
                            optimizer_state=optimizer_state,
                            scheduler_state=self.scheduler.state_dict(),
                            data_position=self.rollout.source.state_dict(),
                            metadata={"optimizer": self.cfg.optimizer.name}, keep=self.cfg.trainer.keep_checkpoints)
            log.info("saved checkpoint step_%d", self.step)
        dist.barrier()

    def _export_final(self) -> None:
        """RUN/final: the trained policy as a Hugging Face checkpoint (serve it, distil from it, fine-tune it)."""
        from slimecli.train.hf_export import export_hf

        state = full_state_dict(self.model, self.info.is_main)
        if state is not None:
            path = export_hf(state, self.cfg.model.path, self.run_dir / "final")
            log.info("final model written to %s", path)

    def _resume(self) -> bool:
        """Continue from the last complete checkpoint of this run dir, if any."""
        from slimecli.train import checkpoint

        # rank 0 decides, so every rank resumes from the same checkpoint (or none)
        found = checkpoint.latest_complete(self.run_dir) if self.info.is_main else None
        path = dist.broadcast_object(str(found) if found is not None else None)
        if path is None:
            return False
        ckpt = checkpoint.load(path)
        load_full_state_dict(self.model, ckpt.model_state)
        if ckpt.optimizer_state is not None:
            load_full_optimizer_state(self.model, self.optimizer, ckpt.optimizer_state)
        if ckpt.scheduler_state is not None:
            self.scheduler.load_state_dict(ckpt.scheduler_state)
        if ckpt.rng is not None and self.info.is_main:
            checkpoint.restore_rng(ckpt.rng)
        self.step = ckpt.step
        if self.rollout is not None and ckpt.data_position is not None:
            self.rollout.source.load_state_dict(ckpt.data_position)
        if self.info.is_main:
            log.info("resumed from %s at step %d", path, self.step)
        return True

    # ---- per-token quantities -----------------------------------------------------------------
    def _logp(self, model: torch.nn.Module, batch: PackedBatch, with_entropy: bool) -> tuple[torch.Tensor, Any]:
        logits = response_logits(model, batch)
        t = self.cfg.rollout.temperature
        logp = log_probs_from_logits(logits, batch.targets, t)  # chunked: no second [B, R, V] tensor
        entropy = None
        if with_entropy:  # without an entropy bonus it is only a metric: keep it out of the graph
            with torch.enable_grad() if self.cfg.trainer.entropy_coef != 0 else torch.no_grad():
                entropy = entropy_from_logits(logits, t)
        return logp, entropy

    @torch.no_grad()
    def _score(self, model: torch.nn.Module, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-sample response log-probs (no gradient), micro-batched."""
        out: list[torch.Tensor] = []
        mb = self.cfg.trainer.micro_batch_size
        for i in range(0, len(samples), mb):
            chunk = samples[i:i + mb]
            logp, _ = self._logp(model, pack(chunk, self.pad_id).to(self.info.device), False)
            out.extend(logp[j, :s.response_length].float().cpu() for j, s in enumerate(chunk))
        return out

    # ---- one step ---------------------------------------------------------------------------------
    def _train_on(self, batch: StepBatch) -> dict[str, float]:
        cfg, info = self.cfg, self.info
        samples, rewards = batch.samples, batch.rewards
        gbs = cfg.trainer.global_batch_size
        n_updates = len(samples) // gbs
        recompute_old = n_updates > 1 and not cfg.trainer.use_rollout_logprobs
        ref_logp = self._score(self.ref_model, samples) if self.ref_model is not None else None
        old_all = self._score(unwrap(self.model), samples) if (recompute_old or cfg.trainer.use_tis) else None
        rollout_lp = [torch.tensor(s.rollout_log_probs or [0.0] * s.response_length) for s in samples]
        if cfg.trainer.use_rollout_logprobs:
            old_all = rollout_lp
        kl_shaping = None
        if cfg.trainer.kl_coef != 0 and ref_logp is not None:
            base = old_all if old_all is not None else self._score(unwrap(self.model), samples)
            kl_shaping = [kl_penalty(b, r, "k1") for b, r in zip(base, ref_logp, strict=True)]
        student = old_all if old_all is not None else rollout_lp
        adv = adv_lib.compute_advantages(samples, rewards, cfg.trainer, cfg.rollout.n_samples_per_prompt,
                                         kl=kl_shaping, student_logp=student if cfg.trainer.opd_kl_coef else None)
        sums: dict[str, float] = {}
        grad_norms = []
        mb = cfg.trainer.micro_batch_size
        for u in range(n_updates):
            idx = list(range(u * gbs, (u + 1) * gbs))
            step_weights: list[torch.Tensor] = [torch.zeros(0)] * len(samples)
            for k, w in zip(idx, loss_weights([samples[i] for i in idx], cfg.trainer.loss_reduction), strict=True):
                step_weights[k] = w
            mine = idx[info.rank::info.world_size]
            chunks = [mine[i:i + mb] for i in range(0, len(mine), mb)]
            for c, chunk in enumerate(chunks):
                packed = pack([samples[i] for i in chunk], self.pad_id).to(info.device)
                width = packed.targets.shape[1]

                def rows(values: list[torch.Tensor], chunk: list[int] = chunk, width: int = width) -> torch.Tensor:
                    return _pad_to(pad_sequences([values[i] for i in chunk]), width).to(info.device)

                with no_sync_unless(self.model, c == len(chunks) - 1):
                    logp, entropy = self._logp(self.model, packed, with_entropy=True)
                    loss, metrics = policy_loss(
                        logp, rows(old_all) if old_all is not None else logp.detach(), rows(adv.advantages),
                        rows(step_weights), cfg.trainer, mask=packed.mask, entropy=entropy,
                        ref_logp=rows(ref_logp) if ref_logp is not None else None,
                        rollout_logp=packed.rollout_log_probs)
                    (loss * info.world_size).backward()  # DDP averages gradients over ranks
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
            grad_norms.append(self._optimizer_step())
        out = {f"train/{k}": v / max(n_updates, 1) for k, v in dist.all_reduce_sum(sums).items()}
        out["train/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        out["train/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()  # the lr schedule counts training steps, like trainer.max_steps
        out["train/updates"] = n_updates
        return out

    def _optimizer_step(self) -> float:
        from slimecli.train.optim.build import reset_optimizer_state

        clip = self.cfg.optimizer.clip_grad
        params = [p for p in self.model.parameters() if p.grad is not None]
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) if params else 0.0
        if self.cfg.optimizer.reset_state_each_step:
            reset_optimizer_state(self.optimizer)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def _progress_text(step_mean: float | None, running: str) -> str:
    """'step reward 0.984 | running reward 0.451' (the running mean covers every step so far)."""
    running = f"running {running}" if running else ""
    if step_mean is None:
        return running
    return f"step reward {step_mean:.3f} | {running}" if running else f"step reward {step_mean:.3f}"


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    if t.shape[1] >= width:
        return t[:, :width]
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))
