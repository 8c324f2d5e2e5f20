from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slimecli.config.decode import spec
from slimecli.config.groups.critic import CriticConfig
from slimecli.config.groups.lora import LoraConfig

# Hugging Face model families that trainer=megatron converts (slimecli/model/megatron/convert.py)
MEGATRON_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class TrainerConfig:
    """Policy-gradient training: back-end, parallelism, loss and advantage settings."""

    name: Literal["torch", "megatron"] = "torch"
    nproc: int = spec(1, gt=0, resumable=True)  # ranks per node
    max_steps: int = spec(100, gt=0, resumable=True)
    global_batch_size: int = spec(8, gt=0)  # samples per optimizer step
    micro_batch_size: int = spec(4, gt=0, resumable=True)
    # set: micro-batches of at most this many padded tokens (samples x the longest), samples of like length together,
    # in place of micro_batch_size (verl's use_dynamic_bsz): a long tail's short samples are not padded to its long ones
    max_tokens_per_micro_batch: int | None = spec(None, gt=0, resumable=True, note="or unset: micro_batch_size")
    strategy: Literal["ddp", "fsdp"] = "ddp"  # torch back-end: DDP, or FSDP2 (fully_shard) sharding
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    tensor_parallel_size: int = spec(1, gt=0, resumable=True)
    pipeline_parallel_size: int = spec(1, gt=0, resumable=True)
    # a registered estimator (grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, gae: PPO with
    # trainer.critic) or package.module:function;
    # gspo (deprecated) = grpo + importance_level=sequence
    advantage_estimator: str = "grpo"
    policy_loss: str = "ppo_clip"  # a registered policy loss (ppo_clip, cispo) or package.module:function
    importance_level: Literal["token", "sequence"] = "token"  # sequence: GSPO's per-token geometric-mean sequence ratio
    scale_by_std: bool = True  # grpo divides by the group std
    gamma: float = spec(1.0, ge=0, le=1)  # reinforce++ and gae discount
    eps_clip: float = spec(0.2, ge=0)
    eps_clip_high: float | None = spec(None, ge=0, note="or unset: eps_clip")  # None -> eps_clip
    eps_clip_c: float | None = spec(None, gt=1, note="the dual clip constant")
    # policy_loss=cispo (MiniMax-M1): every token's gradient weighted by the stop-gradient importance weight
    # clip(ratio, 1 - cispo_eps_low, 1 + cispo_eps_high); no token's gradient is clipped away
    cispo_eps_low: float = spec(1.0, ge=0, le=1, note="1: no lower bound on the weight, as in MiniMax-M1")
    cispo_eps_high: float = spec(0.28, ge=0)
    kl_coef: float = spec(0.0, ge=0)  # KL reward shaping
    kl_loss_coef: float = spec(0.0, ge=0)  # KL loss against the frozen reference
    kl_loss_type: Literal["k1", "k2", "low_var_kl"] = "low_var_kl"
    entropy_coef: float = spec(0.0, ge=0)  # > 0: an entropy bonus
    use_tis: bool = False  # deprecated: trainer.off_policy_correction=tis
    # how the gap between the engine's policy (that sampled the tokens) and the trainer's is corrected: none, tis
    # (truncated importance weights), mis (whole sequences masked outside the bounds), icepop (tokens masked outside
    # the bounds), decoupled_ppo (AReaL's: a proximal policy, tokens above is_mask_high masked), or an import path
    off_policy_correction: str = "none"
    tis_clip_low: float = spec(0.0, ge=0)
    tis_clip_high: float = spec(2.0, gt=0)
    is_mask_low: float = spec(0.5, ge=0)  # mis, icepop: an importance ratio below this is masked
    is_mask_high: float = spec(2.0, gt=0)  # mis, icepop, decoupled_ppo: an importance ratio above this is masked
    use_rollout_logprobs: bool = False  # old log-probs from the engine instead of a recompute
    # per_rollout: each rollout's token mean, averaged; per_token: the step's token mean; token_sum_norm (Dr. GRPO):
    # each rollout's token sum / rollout.max_new_tokens, averaged
    loss_reduction: Literal["per_rollout", "per_token", "token_sum_norm"] = "per_rollout"
    # DAPO's overlong reward shaping: a response longer than rollout.max_new_tokens - overlong_buffer tokens loses
    # reward linearly, up to overlong_penalty at rollout.max_new_tokens (the logged task reward is unchanged)
    overlong_buffer: int = spec(0, ge=0, note="0 turns the penalty off")
    overlong_penalty: float = spec(1.0, ge=0)
    opd_kl_coef: float = spec(0.0, ge=0)  # on-policy distillation strength
    # scale of the task reward in the advantages; 0 = pure distillation (the reward is still logged)
    reward_coef: float = spec(1.0, ge=0, note="0 = pure distillation")
    save_interval: int = spec(0, ge=0, note="0 = only at the end", resumable=True)
    # the newest checkpoints kept on disk (older ones are pruned after each save)
    keep_checkpoints: int = spec(2, note="0 or less keeps every checkpoint, so any int is allowed")
    gradient_checkpointing: bool = spec(False, resumable=True)
    # trainer=megatron with tensor_parallel_size > 1: norms, dropout and residuals split along the sequence over
    # the TP ranks too (activation memory / tp outside attention and MLP; inputs padded to a multiple of tp)
    sequence_parallel: bool = spec(False, resumable=True)
    # how new weights reach the engines: disk (an HF dir + update_weights_from_disk; any engine),
    # shared_memory (a tmpfs segment; embedded engines on this host), nccl (SGLang's weight-update group)
    weight_sync: Literal["disk", "shared_memory", "nccl"] = spec("disk", resumable=True)
    weight_sync_bucket_mb: int = spec(512, gt=0, resumable=True)  # nccl: tensors per broadcast request, in MiB
    # the engines generate the next steps' rollouts while the trainer trains (docs/async.md)
    async_rollout: bool = False
    # async_rollout: a sample trains at most this many weight versions after the one that began it (1: one step
    # ahead; more needs async_rollout); the rollouts of up to this many steps ahead are generated meanwhile
    max_staleness: int = spec(1, ge=1, note="the rollout that overlaps a training step is one version behind")
    # wait: a rollout starts only when it will train within max_staleness; drop: rollouts start as soon as there is
    # room, and samples that end up further behind are not trained on (counted: rollout/stale_dropped)
    staleness_strategy: Literal["wait", "drop"] = "wait"
    # a weight push pauses the requests in flight, which keep their tokens and go on under the new weights
    # (without it, a push waits until the requests in flight finish)
    partial_rollouts: bool = False
    pause_mode: Literal["in_place", "retract"] = "in_place"  # partial_rollouts: keep the KV cache, or recompute it
    critic: CriticConfig = field(default_factory=CriticConfig)  # advantage_estimator=gae's value model
    lora: LoraConfig = field(default_factory=LoraConfig)  # trainer.lora.rank > 0: train adapters only (docs/lora.md)
