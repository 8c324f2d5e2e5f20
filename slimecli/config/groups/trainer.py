from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slimecli.config.decode import spec
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
    strategy: Literal["ddp", "fsdp"] = "ddp"  # torch back-end: DDP, or FSDP2 (fully_shard) sharding
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    tensor_parallel_size: int = spec(1, gt=0, resumable=True)
    pipeline_parallel_size: int = spec(1, gt=0, resumable=True)
    # a registered estimator (grpo, reinforce_plus_plus, reinforce_plus_plus_baseline) or package.module:function;
    # gspo (deprecated) = grpo + importance_level=sequence
    advantage_estimator: str = "grpo"
    policy_loss: str = "ppo_clip"  # a registered policy loss or package.module:function
    importance_level: Literal["token", "sequence"] = "token"  # sequence: GSPO's per-token geometric-mean sequence ratio
    scale_by_std: bool = True  # grpo divides by the group std
    gamma: float = 1.0  # reinforce++ discount
    eps_clip: float = spec(0.2, ge=0)
    eps_clip_high: float | None = None  # None -> eps_clip
    eps_clip_c: float | None = spec(None, gt=1, note="the dual clip constant")
    kl_coef: float = 0.0  # KL reward shaping
    kl_loss_coef: float = 0.0  # KL loss against the frozen reference
    kl_loss_type: Literal["k1", "k2", "low_var_kl"] = "low_var_kl"
    entropy_coef: float = 0.0
    use_tis: bool = False
    tis_clip_low: float = 0.0
    tis_clip_high: float = 2.0
    use_rollout_logprobs: bool = False  # old log-probs from the engine instead of a recompute
    loss_reduction: Literal["per_rollout", "per_token"] = "per_rollout"
    opd_kl_coef: float = spec(0.0, ge=0)  # on-policy distillation strength
    reward_coef: float = 1.0  # scale of the task reward in the advantages; 0 = pure distillation (still logged)
    save_interval: int = spec(0, resumable=True)  # 0 -> only at the end
    keep_checkpoints: int = 2
    gradient_checkpointing: bool = spec(False, resumable=True)
    # trainer=megatron with tensor_parallel_size > 1: norms, dropout and residuals split along the sequence over
    # the TP ranks too (activation memory / tp outside attention and MLP; inputs padded to a multiple of tp)
    sequence_parallel: bool = spec(False, resumable=True)
    # how new weights reach the engines: disk (an HF dir + update_weights_from_disk; any engine),
    # shared_memory (a tmpfs segment; embedded engines on this host), nccl (SGLang's weight-update group)
    weight_sync: Literal["disk", "shared_memory", "nccl"] = spec("disk", resumable=True)
    weight_sync_bucket_mb: int = spec(512, gt=0, resumable=True)  # nccl: tensors per broadcast request, in MiB
    # one-step off-policy: the engines generate step k+1's rollout while the trainer trains on step k; the
    # weights are pushed once that rollout is in, so no sequence mixes two weight versions
    async_rollout: bool = False
    max_staleness: int = spec(1, ge=1, note="the rollout that overlaps a training step is one version behind")  # async_rollout: samples more weight versions behind than this are not trained on
    lora: LoraConfig = field(default_factory=LoraConfig)  # trainer.lora.rank > 0: train adapters only (docs/lora.md)
