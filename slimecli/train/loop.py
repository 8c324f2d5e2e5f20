"""The trainer: every rank runs the same recipe, the way torchtune's recipes read:

    setup (__init__) -> resume -> start -> train_step, until trainer.max_steps -> export_final; cleanup

One step = one rollout (rollout.batch_size prompts x n samples) followed by
samples / trainer.global_batch_size optimizer updates, then a weight push to the engines.
The step's stages (rollout -> old_logp -> ref_logp -> advantages -> update -> sync_weights -> eval -> save)
live in stages.py; this module orchestrates them and times them. Rank 0's own work (the servers, the run's
records) is its coordinator's (coordinator/, in parts); the other ranks hold one whose parts do none of it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, cast

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.observe import startup
from slimecli.train import critic as critic_stages
from slimecli.train import dist, stages
from slimecli.train.backend import PolicyBackend
from slimecli.train.coordinator import make_coordinator
from slimecli.train.registry import (
    get_advantage_estimator,
    get_off_policy_correction,
    get_policy_loss,
    uses_critic,
)
from slimecli.train.stages import RankContext, StageTimer, StepBatch, StepTensors

__all__ = ["StepBatch", "Trainer"]

log = logging.getLogger("slimecli.train")


class Trainer:
    def __init__(self, cfg: SlimeConfig, run_dir: Path):
        """Setup: the process group, the tokenizer, the policy (and frozen reference), the lr schedule, and the
        coordinator (rank 0's link to the servers)."""
        from slimecli.model.loading import load_tokenizer
        from slimecli.train.optim.build import build_scheduler

        self.cfg = cfg
        self.step_cfg = cfg  # what the stages read (deprecated spellings were rewritten by the config layer)
        get_advantage_estimator(self.step_cfg.trainer.advantage_estimator)  # a bad import path fails before rollout
        get_policy_loss(self.step_cfg.trainer.policy_loss)
        if self.step_cfg.trainer.off_policy_correction != "none":
            get_off_policy_correction(self.step_cfg.trainer.off_policy_correction)
        self.run_dir = run_dir
        self.info = dist.init(cfg.trainer.dist_backend)
        torch.manual_seed(cfg.run.seed + self.info.rank)
        self.tokenizer = load_tokenizer(cfg.model.resolved_tokenizer_path)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.policy = make_policy(cfg, self.info)
        needs_ref = cfg.trainer.kl_loss_coef != 0 or cfg.trainer.kl_coef != 0
        self.ref_policy = make_reference(cfg, self.info, self.policy) if needs_ref else None
        self.critic = None  # trainer.critic: PPO's value model, for estimators that take values (gae)
        if uses_critic(self.step_cfg.trainer.advantage_estimator):
            from slimecli.train.critic import make_critic

            self.critic = make_critic(cfg, self.info)
        startup.mark("model loaded")
        self.ctx = RankContext(pad_id, cfg.trainer.micro_batch_size, cfg.rollout.temperature, self.info.device,
                               self.policy.data_rank, self.policy.data_size, cfg.trainer.max_tokens_per_micro_batch)
        self.scheduler = build_scheduler(self.policy.lr_optimizer(), cfg.optimizer, cfg.trainer.max_steps)
        self.step = 0  # completed steps
        self.restored_metrics: dict[str, Any] | None = None  # the resumed checkpoint's metrics row
        self.coordinator = make_coordinator(cfg, run_dir, self.tokenizer, self.policy, self.info.is_main)

    # ---- the run ----------------------------------------------------------------------------------
    def run(self) -> None:
        """resume -> start -> train_step until trainer.max_steps -> export_final; cleanup whatever happens."""
        if self.cfg.rollout.replay_steps:
            self.replay_steps()
            return
        resumed = self.resume()
        self.start(resumed)
        try:
            first = True
            while self.step < self.cfg.trainer.max_steps:
                self.train_step()
                if first:
                    startup.mark("first step")
                    first = False
            self.export_final()
        finally:
            self.cleanup()
        dist.barrier()

    def resume(self) -> bool:
        """Continue from the last complete checkpoint of this run dir, if any: rank 0 picks it, so that every
        rank resumes from the same one (or none)."""
        path = dist.broadcast_object(self.coordinator.resume_point())
        if path is None:
            return False
        ckpt = self.load_checkpoint(path)
        self.restored_metrics = ckpt.metadata.get("metrics")
        self.coordinator.restore(ckpt)
        return True

    def load_checkpoint(self, path: str) -> Any:
        """The weights, optimizer and lr schedule of a checkpoint, and its step."""
        from slimecli.checkpoint import store

        ckpt = store.load(path)
        self.policy.load_full_state_dict(ckpt.model_state)
        if ckpt.sharded is not None:  # the back-end's own format: its weights and optimizer state, any layout
            from slimecli.train.optim.build import keeps_optimizer_state

            self.policy.load_sharded(ckpt.sharded, with_optimizer=keeps_optimizer_state(self.cfg.optimizer))
        if ckpt.optimizer_state is not None:
            self.policy.load_optimizer_state(ckpt.optimizer_state)
        if ckpt.scheduler_state is not None:
            self.scheduler.load_state_dict(ckpt.scheduler_state)
        if self.critic is not None:
            if ckpt.critic_state is None:
                raise ValueError(f"{path} has no critic state (critic.pt): it was written by a run without "
                                 "trainer.advantage_estimator=gae")
            self.critic.load_state(ckpt.critic_state)
            log.info("critic restored from %s", path)
        self.step = ckpt.step
        return ckpt

    def replay_steps(self) -> None:
        """rollout.replay_steps: each step trained alone on its dumped samples, from the dumped run's checkpoint
        of the step before (step 1: from model.path), its metrics row in this run's records; no checkpoint, no
        final model (a replay is for looking at a step again)."""
        from slimecli.checkpoint.layout import is_complete, step_dirs
        from slimecli.rollout.dump import dumped_run

        run = dumped_run(self.cfg.rollout.replay or "")
        checkpoints = {step: str(path) for step, path in step_dirs(run) if is_complete(path)} if run else {}
        self.coordinator.wait_ready()
        self.coordinator.open_records(0, None)
        try:
            for k in sorted(self.cfg.rollout.replay_steps):
                if k > 1:
                    self.load_checkpoint(dist.broadcast_object(checkpoints[k - 1]))
                log.info("replaying step %d", k)
                self.train_step()
        finally:
            self.cleanup()
        dist.barrier()

    def start(self, resumed: bool) -> None:
        """The engines up (a resumed run's given its weights: they start from model.path), the records, then the
        rollouts (with async_rollout, from now on ahead of the trainer) and the evaluation of the weights it
        starts from, where one is due."""
        self.coordinator.wait_ready()
        startup.mark("ready")
        if resumed:
            stages.sync_weights(self.policy, self.coordinator.weights, self.step, self.info.is_main)
        self.coordinator.open_records(self.step, self.restored_metrics)
        self.coordinator.rollouts.start(self.step)
        self.coordinator.evaluate_start(self.step)

    def train_step(self) -> None:
        """rollout -> old_logp -> ref_logp -> advantages -> update -> sync_weights -> eval, each timed, then a
        checkpoint when one is due and the step's row in the records. An evaluation runs beside training: its
        metrics join its step's row, which waits for them (the last step waits for the evaluation)."""
        timer, started = StageTimer(), time.perf_counter()
        if self.step + 1 == hang_at_step():
            hang_for_tests(self.step + 1)
        batch = self.collect(timer)
        metrics = self.train_on(batch, timer)
        self.step += 1
        state = self.sync_weights(timer)
        self.coordinator.evaluation.begin(self.step, self.coordinator.weights.delivery)
        with timer.stage("eval"):
            evaluations = self.coordinator.evaluation.landed(wait=self.step == self.cfg.trainer.max_steps)
        own = dict(evaluations).get(self.step, {})  # the checkpoint keeps it when it is in already
        row = self.coordinator.step_row(self.step, batch, metrics, own, timer, started)
        if self.should_save():
            with timer.stage("save"):
                self.save(state, {**row, **timer.metrics()} if row is not None else None)
        self.coordinator.record(self.step, row, timer, batch, evaluations)

    def cleanup(self) -> None:
        """Rank 0 closes its records and its link to the servers (a rollout still in flight is dropped)."""
        self.coordinator.close()

    # ---- the stages of a step -----------------------------------------------------------------------
    def collect(self, timer: StageTimer) -> StepBatch:
        """The rollout stage: every rank gets the batch rank 0 took (generated ahead with trainer.async_rollout),
        and its staleness: how many versions behind the weights it trains each sample was begun."""
        with timer.stage("rollout"):
            batch = stages.rollout(self.coordinator.rollouts, self.step)
            if self.cfg.trainer.async_rollout and not self.cfg.rollout.replay:
                batch.metrics.update(stages.staleness(batch, self.step, self.cfg.trainer.max_staleness))
        self.coordinator.dump(self.step + 1, batch)  # rollout.dump: before it trains, as it trains
        return batch

    def train_on(self, batch: StepBatch, timer: StageTimer | None = None) -> dict[str, float]:
        """The step's compute stages: old_logp -> ref_logp -> advantages (with the off-policy correction) ->
        update; the update's metrics and the off_policy/* ones."""
        timer = timer or StageTimer()
        t = self.step_cfg.trainer
        with timer.stage("old_logp"):
            old = stages.old_logp(self.policy, batch, t, self.ctx, has_ref=self.ref_policy is not None)
        with timer.stage("ref_logp"):
            ref = stages.ref_logp(self.ref_policy, batch, self.ctx)
        with timer.stage("advantages"):
            values = critic_stages.values(self.critic, batch, self.ctx) if self.critic is not None else None
            shaped, shaping = stages.overlong(batch, self.step_cfg)
            adv = stages.advantages(shaped, old, ref, t, self.cfg.rollout.n_samples_per_prompt, values,
                                    opd_coefs=stages.opd_coefs(self.step_cfg, batch.samples))
            weights, off_policy = stages.off_policy(batch, old, t, self.step)
        with timer.stage("update"):
            self.coordinator.weights.before_update()
            metrics = stages.update(self.policy, self.scheduler, batch, StepTensors(old, ref, adv, weights),
                                    self.step_cfg, self.ctx)
            if self.critic is not None and values is not None:
                metrics.update(critic_stages.update(self.critic, batch, values, adv, self.step_cfg, self.ctx))
        return {**shaping, **off_policy, **metrics}

    def sync_weights(self, timer: StageTimer) -> dict[str, torch.Tensor] | None:
        """The new weights to the engines; rank 0 gets them back (for the checkpoint). A wait there for the
        rollouts in flight (a push without partial rollouts) counts as rollout time: what training did not hide."""
        with timer.stage("sync_weights"):
            state = stages.sync_weights(self.policy, self.coordinator.weights, self.step, self.info.is_main)
        timer.move("sync_weights", "rollout", self.coordinator.rollouts.take_wait())
        return state

    def should_save(self) -> bool:
        if self.cfg.rollout.replay_steps:  # a replay of chosen steps keeps nothing
            return False
        interval = self.cfg.trainer.save_interval
        return self.step == self.cfg.trainer.max_steps or (interval > 0 and self.step % interval == 0)

    def save(self, model_state: dict[str, torch.Tensor] | None, row: dict[str, Any] | None) -> None:
        critic_state = self.critic.state(self.info.is_main) if self.critic is not None else None
        path = stages.save(self.run_dir, self.step, self.policy, self.scheduler, model_state, self.cfg,
                           is_main=self.info.is_main, data_position=self.coordinator.data_position(), metrics=row,
                           critic_state=critic_state)
        if path is not None:
            log.info("saved checkpoint step_%d", self.step)

    def export_final(self) -> None:
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


# a test hook: with SLIMECLI_TEST_HANG_AT_STEP=N, training step N blocks for good, as a hung collective or a lost
# server would (the stall watchdog's test, launch/stall.py). Read when used (see engine/server.py's HANG_ENV).
def hang_at_step() -> int:
    return int(os.environ.get("SLIMECLI_TEST_HANG_AT_STEP", "0") or 0)


def hang_for_tests(step: int) -> None:
    log.info("SLIMECLI_TEST_HANG_AT_STEP=%d: blocking", step)
    while True:
        time.sleep(60)


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

