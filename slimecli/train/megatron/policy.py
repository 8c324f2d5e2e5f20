"""trainer=megatron: the PolicyBackend on megatron-core (tensor, pipeline and data parallel).

Micro-batches go through megatron-core's own pipeline schedules (``get_forward_backward_func``), gradients
through its DistributedDataParallel and the update through ``get_megatron_optimizer`` (with the StatelessAdam
patch for optimizer=stateless_adam). Log-probs are computed vocab-parallel (vocab.py). Losses are the same
registered losses as trainer=torch: the stages hand a loss function in, the schedule calls it on the last
pipeline stage. ``calculate_per_token_loss`` is on and the model-gradient finaliser gets no token count, so the
schedule neither divides the loss by the micro-batch count nor DDP averages over replicas: the stages' loss
weights already make a plain sum the step's value.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slimecli.config.schema import SlimeConfig
from slimecli.model.megatron.build import GPTSpec, build_model, gather_hf_state, init_parallel, load_hf_state
from slimecli.train.backend import LossFn
from slimecli.train.batch import PackedBatch
from slimecli.train.dist import DistInfo
from slimecli.train.megatron.vocab import log_probs_and_entropy

log = logging.getLogger("slimecli.train.megatron")


class MegatronPolicy:
    def __init__(self, cfg: SlimeConfig, info: DistInfo, trainable: bool = True) -> None:
        from megatron.core import parallel_state as ps

        t = cfg.trainer
        init_parallel(t.tensor_parallel_size, t.pipeline_parallel_size, cfg.run.seed)
        module, self.arch, self.config = build_model(gpt_spec(cfg))
        module.to(info.device)
        self.device = info.device
        self.data_rank = ps.get_data_parallel_rank()
        self.data_size = ps.get_data_parallel_world_size()
        self.module = module
        self.optimizer: Any = None
        # DP > 1: megatron-core's distributed optimizer shards the fp32 main weights and the moments over the
        # replicas instead of copying them on each (with optimizer=stateless_adam there are no moments to shard)
        self.distributed_optimizer = trainable and self.data_size > 1
        if trainable:
            self.model = self._wrap_ddp(module)
            self.optimizer = self._build_optimizer(cfg)
        else:
            module.eval()
            module.requires_grad_(False)
            self.model = module
        if info.is_main:
            log.info("megatron-core policy: TP=%d PP=%d DP=%d%s%s", ps.get_tensor_model_parallel_world_size(),
                     ps.get_pipeline_model_parallel_world_size(), self.data_size, "" if trainable else " (frozen)",
                     ", distributed optimizer" if self.distributed_optimizer else "")

    def _wrap_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                   use_distributed_optimizer=self.distributed_optimizer)
        ddp = DistributedDataParallel(self.config, ddp_config, module)

        def finalize(models: list[torch.nn.Module], num_tokens: Any = None, **kwargs: Any) -> None:
            finalize_model_grads(models, None, **kwargs)  # no token count: the losses are already weighted

        self.config.finalize_model_grads_func = finalize
        wrapped: torch.nn.Module = ddp
        return wrapped

    def _build_optimizer(self, cfg: SlimeConfig) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from slimecli.train.optim.megatron_patch import megatron_optimizer_context, megatron_optimizer_kwargs

        opt_cfg = OptimizerConfig(**megatron_optimizer_kwargs(cfg.optimizer), params_dtype=self.config.params_dtype,
                                  bf16=self.config.bf16, fp16=self.config.fp16,
                                  use_distributed_optimizer=self.distributed_optimizer)
        with megatron_optimizer_context(cfg.optimizer):
            return get_megatron_optimizer(opt_cfg, [self.model])

    # ---- forward ----------------------------------------------------------------------------------------
    def _run(self, chunks: list[PackedBatch], temperature: float, loss_fn: LossFn | None, *, forward_only: bool,
             entropy_grad: bool = False) -> list[Any]:
        """Every micro-batch through the pipeline schedule; what loss_func reported, on the last stage."""
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        inputs = chunks
        if ps.get_pipeline_model_parallel_world_size() > 1:
            inputs = _same_shape(chunks)
        if self.config.sequence_parallel:  # the sequence splits into TP equal slices
            inputs = _pad_length(inputs, ps.get_tensor_model_parallel_world_size())
        scored: list[torch.Tensor] = []

        def forward_step(data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
            c = next(data_iterator)
            ids = inputs[c].input_ids
            positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)
            causal = torch.triu(torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool, device=ids.device),
                                diagonal=1)
            output = model(ids, positions, causal)

            def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
                packed = chunks[c]
                rows = logits[:packed.input_ids.shape[0]]
                index = packed.logit_index.unsqueeze(-1).expand(-1, -1, rows.shape[-1])
                picked = torch.gather(rows, 1, index)
                logp, entropy = log_probs_and_entropy(picked, packed.targets, self.arch.vocab_size, temperature,
                                                      with_entropy=loss_fn is not None, entropy_grad=entropy_grad)
                if loss_fn is None:
                    scored.append(logp.detach())
                    return logp.sum() * 0.0, torch.tensor(1), {}
                loss, metrics = loss_fn(c, logp, entropy)
                return loss, torch.tensor(1), {k: v.detach() for k, v in metrics.items()}

            return output, loss_func

        first = inputs[0].input_ids
        reported = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(range(len(chunks))), model=[self.model],
            num_microbatches=len(chunks), seq_length=first.shape[1], micro_batch_size=first.shape[0],
            forward_only=forward_only)
        return scored if loss_fn is None else list(reported)

    @torch.no_grad()
    def score(self, chunks: list[PackedBatch], temperature: float) -> list[torch.Tensor]:
        from megatron.core import parallel_state as ps

        scored = self._run(chunks, temperature, None, forward_only=True) if chunks else []
        if ps.get_pipeline_model_parallel_world_size() > 1:  # the last stage has them: hand them to the others
            box: list[Any] = [scored if ps.is_pipeline_last_stage() else None]
            dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(),
                                       group=ps.get_pipeline_model_parallel_group())
            scored = [t.to(self.device) for t in box[0]]
        return scored

    def forward_backward(self, chunks: list[PackedBatch], temperature: float, loss_fn: LossFn, *,
                         entropy_grad: bool) -> list[dict[str, float]]:
        from megatron.core import parallel_state as ps

        reported = self._run(chunks, temperature, loss_fn, forward_only=False, entropy_grad=entropy_grad)
        keys = sorted({k for metrics in reported for k in metrics})  # empty before the last pipeline stage
        if ps.get_pipeline_model_parallel_world_size() > 1:  # the last stage knows the metric names
            box: list[Any] = [keys]
            dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(),
                                       group=ps.get_pipeline_model_parallel_group())
            keys = box[0]
        if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0):
            return [dict.fromkeys(keys, 0.0) for _ in chunks]  # another rank of this replica reports them
        return [{k: float(metrics.get(k, 0.0)) for k in keys} for metrics in reported]

    # ---- update -----------------------------------------------------------------------------------------
    def _optimizer(self) -> Any:
        if self.optimizer is None:
            raise ValueError("this policy is frozen (a reference model): it has no optimizer")
        return self.optimizer

    def _torch_optimizers(self) -> list[torch.optim.Optimizer]:
        opt = self._optimizer()
        return [part.optimizer for part in getattr(opt, "chained_optimizers", None) or [opt]]

    def optimizer_step(self, cfg: SlimeConfig) -> float:
        from slimecli.train.optim.build import reset_optimizer_state

        opt = self._optimizer()
        if cfg.optimizer.reset_state_each_step:
            for inner in self._torch_optimizers():
                reset_optimizer_state(inner)
        norm = opt.get_grad_norm() if cfg.optimizer.clip_grad <= 0 else None
        _, clipped_norm, _ = opt.step()
        self.model.zero_grad_buffer()  # type: ignore[operator]  # megatron-core's DDP method
        opt.zero_grad()
        value = norm if norm is not None else clipped_norm
        return float(value) if value is not None else 0.0

    def lr_optimizer(self) -> torch.optim.Optimizer:
        inner = self._torch_optimizers()
        if len(inner) != 1:
            raise ValueError(f"megatron-core built {len(inner)} optimizers (expert parameters?); the lr schedule "
                             "drives one")
        return inner[0]

    # ---- weights ----------------------------------------------------------------------------------------
    def full_state_dict(self, is_main: bool) -> dict[str, torch.Tensor] | None:
        return gather_hf_state(self.module, self.arch, is_main)

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load_hf_state(self.module, state, self.arch)
        if self.optimizer is not None:  # fp32 main copies of half-precision weights follow the new weights
            reload = getattr(self.optimizer, "reload_model_params", None)
            if reload is not None:
                reload()

    def optimizer_state(self, is_main: bool) -> dict[str, Any] | None:
        return None  # in the sharded checkpoint (save_sharded), each rank its own part

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        raise ValueError("trainer=megatron keeps its optimizer state in the checkpoint's sharded/ directory, "
                         "not in optimizer.pt")

    # ---- megatron-core distributed checkpoints ------------------------------------------------------------
    def _sharded_state(self, loading: bool, with_optimizer: bool) -> dict[str, Any]:
        module: Any = self.module
        model = module.sharded_state_dict()
        state: dict[str, Any] = {"model": model}
        if with_optimizer and self.optimizer is not None:
            # the distributed optimizer's shards in a layout-free format, so a resume may change TP/PP/DP
            extra = {"metadata": {"distrib_optim_sharding_type": "fully_reshardable"}} if self.distributed_optimizer else {}
            if loading and self.distributed_optimizer:
                from slimecli.train.megatron.dist_checkpoint import prepare_optimizer_load

                prepare_optimizer_load(self.optimizer)
            state["optimizer"] = self.optimizer.sharded_state_dict(model, is_loading=loading, **extra)
        return state

    def save_sharded(self, directory: Path, *, with_optimizer: bool) -> bool:
        """Every rank writes its own shards of the weights and the optimizer state (no gather); megatron-core
        records the layout, so a later run may load them at other TP/PP/DP sizes."""
        from slimecli.train.megatron import dist_checkpoint

        if dist.get_rank() == 0:
            shutil.rmtree(directory, ignore_errors=True)  # left by a killed writer
            directory.mkdir(parents=True)
        dist.barrier()
        dist_checkpoint.save(self._sharded_state(False, with_optimizer), directory)
        if dist.get_rank() == 0 and with_optimizer:
            dist_checkpoint.write_optimizer_kind(directory, self.distributed_optimizer)
        dist.barrier()
        return True

    def load_sharded(self, directory: Path, *, with_optimizer: bool) -> None:
        from slimecli.train.megatron import dist_checkpoint

        if with_optimizer and self.optimizer is not None:
            dist_checkpoint.check_optimizer_kind(directory, self.distributed_optimizer)
        state = dist_checkpoint.load(self._sharded_state(True, with_optimizer), directory)
        self.module.load_state_dict(state["model"])
        if "optimizer" in state:
            self._optimizer().load_state_dict(state["optimizer"])

    def shared_module(self) -> torch.nn.Module | None:
        return None  # sharded weights: the engines get a gathered copy


def gpt_spec(cfg: SlimeConfig) -> GPTSpec:
    t = cfg.trainer
    return GPTSpec(cfg.model.resolved_path, t.tensor_parallel_size, t.pipeline_parallel_size, cfg.model.dtype,
                   cfg.model.trust_remote_code, t.gradient_checkpointing, t.sequence_parallel)


def _same_shape(chunks: list[PackedBatch]) -> list[PackedBatch]:
    """Pipeline stages exchange [S, B, H] activations of one shape: pad every micro-batch's input to the largest."""
    rows = max(c.input_ids.shape[0] for c in chunks)
    width = max(c.input_ids.shape[1] for c in chunks)
    return [_pad(c, rows, width) for c in chunks]


def _pad_length(chunks: list[PackedBatch], multiple: int) -> list[PackedBatch]:
    """Right-pad every input to a length that is a multiple of `multiple` (causal: the padding is never seen)."""
    return [_pad(c, c.input_ids.shape[0], -(-c.input_ids.shape[1] // multiple) * multiple) for c in chunks]


def _pad(c: PackedBatch, rows: int, width: int) -> PackedBatch:
    ids = c.input_ids
    if tuple(ids.shape) == (rows, width):
        return c
    padded = ids.new_zeros(rows, width)
    padded[:ids.shape[0], :ids.shape[1]] = ids
    return replace(c, input_ids=padded)

