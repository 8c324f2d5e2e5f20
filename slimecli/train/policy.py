"""trainer=torch: the policy model on a trainer rank (loading, wrapping in DDP or FSDP2, whole-model state,
response logits) and TorchPolicy, its PolicyBackend."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from slimecli.config.schema import SlimeConfig
from slimecli.train.backend import LossFn
from slimecli.train.batch import PackedBatch
from slimecli.train.dist import DistInfo, unwrap

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(cfg: SlimeConfig, info: DistInfo, trainable: bool = True) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cfg.model.resolved_path, dtype=DTYPES[cfg.model.dtype],
                                                 trust_remote_code=cfg.model.trust_remote_code,
                                                 attn_implementation="sdpa")
    model.to(info.device)  # type: ignore[arg-type]  # transformers' stubs type .to() for its own use
    if not trainable:
        model.eval().requires_grad_(False)  # type: ignore[no-untyped-call]  # transformers' eval() is unannotated
        return model
    if cfg.trainer.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]  # unannotated in transformers
    if cfg.trainer.lora.enabled:
        from slimecli.train.lora import wrap

        model = wrap(model, cfg)  # type: ignore[assignment]  # a PeftModel, which forwards to the HF model
    model.train()
    if info.world_size == 1:
        return model
    if cfg.trainer.strategy == "fsdp":
        return _fully_shard(model)
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def _fully_shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard every decoder layer, then the rest (embeddings, head) at the root."""
    from torch.distributed.fsdp import fully_shard

    from slimecli.train.lora import base_model

    layers = getattr(getattr(base_model(model), "model", None), "layers", None)
    for layer in layers if layers is not None else []:
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module, is_main: bool) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on CPU, for rank 0 (None elsewhere).

    Under FSDP this gathers the shards, so every rank must call it; otherwise only rank 0 works.
    """
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast(dict[str, torch.Tensor], state) if is_main else None
    if not is_main:
        return None
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Counterpart of full_state_dict; every rank passes the whole state (``strict=False``: a part of it, such as
    a LoRA run's adapters, every key of which must still be the model's)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))
        return
    result = unwrap(model).load_state_dict(state, strict=strict)
    if result.unexpected_keys:
        raise ValueError(f"the checkpoint has tensors the model lacks: {', '.join(result.unexpected_keys[:3])}")


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         is_main: bool) -> dict[str, Any] | None:
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(model, optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if is_main else None
    return optimizer.state_dict() if is_main else None


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)


def response_logits(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Logits [B, R, V] of the positions that predict each response token.

    A model that takes ``logits_to_keep`` projects only those positions onto the vocabulary: an agent sample is
    a long prompt (the CLI's system prompt) with a short response, and [B, L, V] logits would not fit.
    The batch is right-padded, so under the causal mask alone no real token sees a pad: no attention mask is
    passed (a padding mask costs a [B, 1, L, L] mask and a slower attention kernel per layer).
    """
    if _keeps_logits(model):
        out = model(input_ids=batch.input_ids, use_cache=False, logits_to_keep=batch.logit_index)
        kept: torch.Tensor = out.logits  # a causal LM's output: logits [B, R, V]
        return kept.float()
    out = model(input_ids=batch.input_ids, use_cache=False)
    logits: torch.Tensor = out.logits  # [B, L, V]
    index = batch.logit_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return torch.gather(logits, 1, index).float()


def _keeps_logits(model: torch.nn.Module) -> bool:
    from slimecli.train.lora import base_model

    inner = base_model(model.module if isinstance(model, DistributedDataParallel) else model)  # peft passes it on
    return "logits_to_keep" in inspect.signature(type(inner).forward).parameters


@contextmanager
def no_sync_unless(model: torch.nn.Module, last: bool) -> Iterator[None]:
    """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP) on all but the last micro-batch."""
    if is_sharded(model):
        sharded = cast("FSDPModule", model)
        sharded.set_requires_gradient_sync(last)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)
        return
    ctx = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else nullcontext()
    with ctx:
        yield


def forward_logp(model: torch.nn.Module, packed: PackedBatch, temperature: float, *, with_entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, R] (and entropy) of the response tokens at the sampling temperature."""
    from slimecli.train.losses import log_probs_and_entropy, log_probs_from_logits

    logits = response_logits(model, packed)
    if not with_entropy:  # chunked: no second [B, R, V] tensor
        return log_probs_from_logits(logits, packed.targets, temperature), None
    # without an entropy bonus the entropy is only a metric, kept out of the graph
    return log_probs_and_entropy(logits, packed.targets, temperature, entropy_grad=entropy_grad)


class TorchPolicy:
    """trainer=torch: a Hugging Face model, plain, under DDP or under FSDP2; every rank is a data rank."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 data_rank: int = 0, data_size: int = 1, lora: bool = False) -> None:
        self.model = model
        self.lora = lora  # a peft model: its weights in and out are the adapters alone
        self.optimizer = optimizer
        self.data_rank = data_rank
        self.data_size = data_size

    @torch.no_grad()
    def score(self, chunks: list[PackedBatch], temperature: float) -> list[torch.Tensor]:
        model = unwrap(self.model)
        training = model.training
        model.eval()  # scores without dropout (trainer.lora.dropout)
        try:
            return [forward_logp(model, packed, temperature)[0] for packed in chunks]
        finally:
            model.train(training)

    def forward_backward(self, chunks: list[PackedBatch], temperature: float, loss_fn: LossFn, *,
                         entropy_grad: bool) -> list[dict[str, float]]:
        out = []
        for c, packed in enumerate(chunks):
            with no_sync_unless(self.model, c == len(chunks) - 1):
                logp, entropy = forward_logp(self.model, packed, temperature, with_entropy=True,
                                             entropy_grad=entropy_grad)
                loss, metrics = loss_fn(c, logp, entropy)
                # DDP and FSDP average gradients over ranks; the losses are weighted to be summed
                (loss * self.data_size).backward()  # type: ignore[no-untyped-call]  # unannotated in torch
            out.append({k: float(v) for k, v in metrics.items()})
        return out

    def _optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise ValueError("this policy is frozen (a reference model): it has no optimizer")
        return self.optimizer

    def optimizer_step(self, cfg: SlimeConfig) -> float:
        from slimecli.train.optim.build import reset_optimizer_state

        optimizer = self._optimizer()
        clip = cfg.optimizer.clip_grad
        params = [p for p in self.model.parameters() if p.grad is not None]
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        else:
            grads = [p.grad for p in params if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        if cfg.optimizer.reset_state_each_step:
            reset_optimizer_state(optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    def lr_optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer()

    def full_state_dict(self, is_main: bool) -> dict[str, torch.Tensor] | None:
        if not self.lora:
            return full_state_dict(self.model, is_main)
        from slimecli.train.lora import adapter_state

        if is_sharded(self.model):  # the adapters are sharded with their layers: gather, then keep only them
            state = full_state_dict(self.model, is_main)
            return adapter_state(state) if state is not None else None
        return adapter_state(unwrap(self.model).state_dict()) if is_main else None

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not self.lora:
            load_full_state_dict(self.model, state)
            return
        from slimecli.train.lora import model_keys

        load_full_state_dict(self.model, model_keys(state), strict=False)

    def merged_state_dict(self, is_main: bool) -> dict[str, torch.Tensor] | None:
        """A LoRA policy's base weights with the adapters merged in, HF names, on rank 0 (a collective)."""
        from slimecli.train.lora import merged_state

        full = full_state_dict(self.model, is_main) if is_sharded(self.model) else None
        return merged_state(unwrap(self.model), full) if is_main else None

    def optimizer_state(self, is_main: bool) -> dict[str, Any] | None:
        return full_optimizer_state(self.model, self._optimizer(), is_main)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        load_full_optimizer_state(self.model, self._optimizer(), state)

    def save_sharded(self, directory: Path, *, with_optimizer: bool) -> bool:
        return False  # the full HF weights and optimizer.pt are its checkpoint

    def load_sharded(self, directory: Path, *, with_optimizer: bool) -> None:
        raise ValueError(f"{directory}: trainer=torch has no sharded checkpoint format (written by trainer=megatron?)")

    def shared_module(self) -> torch.nn.Module | None:
        return None if is_sharded(self.model) else unwrap(self.model)
