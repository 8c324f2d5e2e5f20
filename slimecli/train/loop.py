"""The torch trainer: rank 0 drives rollout, every rank trains on its share, rank 0 syncs weights.

One step = one rollout (rollout.batch_size prompts x n samples) followed by
samples / trainer.global_batch_size optimizer updates, then a weight push to the engines.
The step's stages (rollout -> old_logp -> ref_logp -> advantages -> update -> sync_weights -> eval -> save)
live in stages.py; this module orchestrates them, times them and writes the metrics.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, cast

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.train import dist, stages
from slimecli.train.backend import PolicyBackend
from slimecli.train.registry import get_advantage_estimator, get_policy_loss, resolve_deprecated
from slimecli.train.stages import RankContext, StageTimer, StepBatch, StepTensors

__all__ = ["StepBatch", "Trainer"]

log = logging.getLogger("slimecli.train")


class Trainer:
    def __init__(self, cfg: SlimeConfig, run_dir: Path):
        from slimecli.model.loading import load_tokenizer
        from slimecli.train.optim.build import build_scheduler

        if cfg.trainer.advantage_estimator == "gspo":
            log.warning("trainer.advantage_estimator=gspo is deprecated: it means advantage_estimator=grpo "
                        "with trainer.importance_level=sequence; set those instead")
        self.cfg = cfg
        self.step_cfg = dataclasses.replace(cfg, trainer=resolve_deprecated(cfg.trainer))  # what the stages read
        get_advantage_estimator(self.step_cfg.trainer.advantage_estimator)  # a bad import path fails before rollout
        get_policy_loss(self.step_cfg.trainer.policy_loss)
        self.run_dir = run_dir
        self.info = dist.init(cfg.trainer.dist_backend)
        torch.manual_seed(cfg.run.seed + self.info.rank)
        self.tokenizer = load_tokenizer(cfg.model.resolved_tokenizer_path)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.policy = make_policy(cfg, self.info)
        needs_ref = cfg.trainer.kl_loss_coef != 0 or cfg.trainer.kl_coef != 0
        self.ref_policy = make_reference(cfg, self.info, self.policy) if needs_ref else None
        self.ctx = RankContext(pad_id, cfg.trainer.micro_batch_size, cfg.rollout.temperature, self.info.device,
                               self.policy.data_rank, self.policy.data_size)
        self.scheduler = build_scheduler(self.policy.lr_optimizer(), cfg.optimizer, cfg.trainer.max_steps)
        self.step = 0  # completed steps
        self.restored_metrics: dict[str, Any] | None = None  # the resumed checkpoint's metrics row
        self.rollout = None
        if self.info.is_main:
            from slimecli.train.coordinator import RolloutCoordinator

            self.rollout = RolloutCoordinator(cfg, run_dir, self.tokenizer)
            self.rollout.policy = self.policy.shared_module()

    # ---- the run ----------------------------------------------------------------------------------
    def run(self) -> None:
        from slimecli.observe.metrics import MetricsLogger
        from slimecli.observe.progress import RecentRewards, StepProgress, reward_text
        from slimecli.reward.stats import RewardMeter

        cfg = self.cfg
        resumed = self._resume()
        metrics_log = progress = None
        meter = RewardMeter(cfg.reward.key)  # counts the invalid rewards
        recent = RecentRewards()
        if self.info.is_main:
            assert self.rollout is not None
            self.rollout.wait_ready()
        if resumed:  # the engines start from model.path; give them the resumed weights
            stages.sync_weights(self.policy, self.rollout, self.step, self.info.is_main)
        if self.info.is_main:
            metrics_log = MetricsLogger(self.run_dir, resume_step=self.step)
            self._log_lost_row(metrics_log)
            progress = StepProgress(cfg.trainer.max_steps, self.step)
        try:
            while self.step < cfg.trainer.max_steps:
                timer = StageTimer()
                started = time.perf_counter()
                if progress is not None and self.rollout is not None:
                    self.rollout.watch(self.step + 1, progress.note)
                evaluated: dict[str, Any] = {}
                if self.step == 0:  # at_start: the initial weights, reported in the first step's row
                    with timer.stage("eval"):
                        evaluated.update(stages.evaluate(self.rollout, 0) or {})
                with timer.stage("rollout"):
                    batch = stages.rollout(self.rollout)
                    if cfg.trainer.async_rollout:
                        batch.metrics.update(stages.staleness(batch, self.step, cfg.trainer.max_staleness))
                if self.rollout is not None and cfg.trainer.async_rollout and self.step + 1 < cfg.trainer.max_steps:
                    if progress is not None:
                        self.rollout.watch(self.step + 2, progress.note)
                    self.rollout.collect_ahead()  # the next step's rollout, on the weights the engines hold now
                metrics = self.train_on(batch, timer)
                self.step += 1
                with timer.stage("sync_weights"):  # waits there for a rollout generated ahead (rank 0)
                    state = stages.sync_weights(self.policy, self.rollout, self.step, self.info.is_main)
                if self.rollout is not None:  # that wait is the part of the rollout training did not hide
                    timer.move("sync_weights", "rollout", self.rollout.take_ahead_wait())
                with timer.stage("eval"):  # the weights just pushed: every eval.interval steps and at_end
                    evaluated.update(stages.evaluate(self.rollout, self.step) or {})
                row = None
                if self.info.is_main:
                    meter.update(batch.samples)
                    tokens = sum(s.response_length for s in batch.samples)
                    step_s = time.perf_counter() - started
                    train_s = sum(timer.seconds[k] for k in ("old_logp", "ref_logp", "advantages", "update"))
                    row = {**batch.metrics, **metrics, **evaluated, "time/step_s": step_s, "time/train_s": train_s,
                           "perf/tokens_per_s": tokens / step_s, "weight_version": self.step, **_gpu_memory()}
                if self._should_save():
                    with timer.stage("save"):
                        self._save(state, {**row, **timer.metrics()} if row is not None else None)
                if self.info.is_main:
                    assert metrics_log is not None and progress is not None and row is not None
                    metrics_log.log(self.step, {**row, **timer.metrics()})
                    recent.add(batch.metrics.get("reward/mean"))
                    text = reward_text(batch.metrics.get("reward/mean"), recent)
                    if meter.invalid:
                        text = f"{text} ({meter.invalid} invalid rewards so far)"
                    if evaluated and self.rollout is not None and self.rollout.last_eval:
                        text = f"{text} | {self.rollout.last_eval}"
                    progress.update(self.step, text)
            self._export_final()
        finally:
            if progress is not None:
                progress.close()
            if metrics_log is not None:
                metrics_log.close()
            if self.rollout is not None:
                self.rollout.close()
        dist.barrier()

    def train_on(self, batch: StepBatch, timer: StageTimer | None = None) -> dict[str, float]:
        """The step's compute stages: old_logp -> ref_logp -> advantages -> update; the update's metrics."""
        timer = timer or StageTimer()
        t = self.step_cfg.trainer
        with timer.stage("old_logp"):
            old = stages.old_logp(self.policy, batch, t, self.ctx, has_ref=self.ref_policy is not None)
        with timer.stage("ref_logp"):
            ref = stages.ref_logp(self.ref_policy, batch, self.ctx)
        with timer.stage("advantages"):
            adv = stages.advantages(batch, old, ref, t, self.cfg.rollout.n_samples_per_prompt)
        with timer.stage("update"):
            if self.rollout is not None:
                self.rollout.before_update()
            return stages.update(self.policy, self.scheduler, batch, StepTensors(old, ref, adv), self.step_cfg,
                                 self.ctx)

    def _should_save(self) -> bool:
        interval = self.cfg.trainer.save_interval
        return self.step == self.cfg.trainer.max_steps or (interval > 0 and self.step % interval == 0)

    def _save(self, model_state: dict[str, torch.Tensor] | None, row: dict[str, Any] | None) -> None:
        data_position = self.rollout.data_position() if self.rollout is not None else None
        path = stages.save(self.run_dir, self.step, self.policy, self.scheduler, model_state, self.cfg,
                           is_main=self.info.is_main, data_position=data_position, metrics=row)
        if path is not None:
            log.info("saved checkpoint step_%d", self.step)

    def _log_lost_row(self, metrics_log: Any) -> None:
        """A kill between a checkpoint and its metrics line: log the row the checkpoint kept."""
        if self.restored_metrics is None or self.step in _logged_steps(metrics_log.path):
            return
        metrics_log.log(self.step, self.restored_metrics)

    def _export_final(self) -> None:
        """RUN/final: the trained policy as a Hugging Face checkpoint (serve it, distil from it, fine-tune it);
        a LoRA run's final/ is its adapter in peft's format and final-merged/ the model it makes."""
        from slimecli.train.hf_export import export_hf

        if self.cfg.trainer.lora.enabled:
            self._export_lora()
            return
        state = self.policy.full_state_dict(self.info.is_main)
        if state is not None:
            path = export_hf(state, self.cfg.model.resolved_path, self.run_dir / "final")
            log.info("final model written to %s", path)

    def _export_lora(self) -> None:
        from slimecli.train.hf_export import export_hf
        from slimecli.train.lora import untie_if_head_merged, write_adapter
        from slimecli.train.policy import TorchPolicy

        policy = cast(TorchPolicy, self.policy)  # validation admits LoRA only on trainer=torch
        adapter = policy.full_state_dict(self.info.is_main)
        merged = policy.merged_state_dict(self.info.is_main)
        if adapter is not None and merged is not None:
            path = write_adapter(adapter, self.cfg, self.run_dir / "final", with_tokenizer=True)
            log.info("final adapter written to %s", path)
            path = export_hf(merged, self.cfg.model.resolved_path, self.run_dir / "final-merged")
            untie_if_head_merged(path, merged)
            log.info("final merged model written to %s", path)

    def _resume(self) -> bool:
        """Continue from the last complete checkpoint of this run dir, if any."""
        from slimecli.checkpoint import store
        from slimecli.checkpoint.rng import restore_rng

        # rank 0 decides, so every rank resumes from the same checkpoint (or none)
        found = store.latest_complete(self.run_dir) if self.info.is_main else None
        path = dist.broadcast_object(str(found) if found is not None else None)
        if path is None:
            return False
        ckpt = store.load(path)
        self.policy.load_full_state_dict(ckpt.model_state)
        if ckpt.sharded is not None:  # the back-end's own format: its weights and optimizer state, any layout
            from slimecli.train.optim.build import keeps_optimizer_state

            self.policy.load_sharded(ckpt.sharded, with_optimizer=keeps_optimizer_state(self.cfg.optimizer))
        if ckpt.optimizer_state is not None:
            self.policy.load_optimizer_state(ckpt.optimizer_state)
        if ckpt.scheduler_state is not None:
            self.scheduler.load_state_dict(ckpt.scheduler_state)
        if ckpt.rng is not None and self.info.is_main:
            restore_rng(ckpt.rng)
        self.step = ckpt.step
        self.restored_metrics = ckpt.metadata.get("metrics")
        if self.rollout is not None and ckpt.data_position is not None:
            self.rollout.source.load_state_dict(ckpt.data_position)
        if self.info.is_main:
            log.info("resumed from %s at step %d", path, self.step)
        return True


def _gpu_memory() -> dict[str, float]:
    """Rank 0's peak GPU memory so far (torch's allocator), where the trainer runs on a GPU."""
    if not torch.cuda.is_available():
        return {}
    return {"perf/gpu_peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def make_policy(cfg: SlimeConfig, info: dist.DistInfo, trainable: bool = True) -> PolicyBackend:
    """The back-end named by trainer.name: the policy (with its optimizer) or, not trainable, a frozen reference."""
    if cfg.trainer.name == "megatron":
        from slimecli.train.megatron.policy import MegatronPolicy

        return MegatronPolicy(cfg, info, trainable=trainable)
    from slimecli.train.dist import unwrap
    from slimecli.train.optim.build import build_optimizer
    from slimecli.train.policy import TorchPolicy, load_policy

    model = load_policy(cfg, info, trainable=trainable)
    optimizer = build_optimizer(unwrap(model).named_parameters(), cfg.optimizer) if trainable else None
    return TorchPolicy(model, optimizer, data_rank=info.rank, data_size=info.world_size,
                       lora=cfg.trainer.lora.enabled and trainable)


def make_reference(cfg: SlimeConfig, info: dist.DistInfo, policy: PolicyBackend) -> PolicyBackend:
    """The frozen reference of the KL terms: a LoRA run's own model with its adapters off (no second copy)."""
    if cfg.trainer.lora.enabled:
        from slimecli.train.lora import AdapterOffPolicy

        return cast(PolicyBackend, AdapterOffPolicy(policy))
    return make_policy(cfg, info, trainable=False)


def _logged_steps(path: Path) -> set[int]:
    steps = set()
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            steps.add(int(json.loads(line)["step"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # a line cut by a kill
    return steps

