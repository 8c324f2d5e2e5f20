"""One teacher rank: an HF causal LM whose output layer is sharded by vocabulary across the TP group.

Every rank runs the model body (acceptable on CPU; a tensor-parallel body is the GPU back-end's job) and
multiplies the last hidden states by its own [V/tp, H] slice of the output layer, so no rank holds more
than [N, V/tp] logits. All ranks of a TP group must call `score`/`load` with the same arguments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from slimecli.teacher import vocab_parallel as vp


@dataclass
class LoadedModel:
    body: Any  # the decoder stack (returns last hidden states, final norm applied)
    weight: torch.Tensor  # [V/tp, H] this rank's rows of the output layer (padding rows are zero)
    bias: torch.Tensor | None
    shard: vp.VocabShard
    softcap: float | None
    path: str


def load_model_dir(path: str, dtype: str, device: torch.device) -> Any:
    from slimecli.model.loading import load_model

    return load_model(path, dtype, device=str(device))


def rank_device() -> torch.device:
    """This rank's GPU when there is one (nccl carries its tensors), else the CPU (gloo)."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def shard_model(model: Any, path: str, tp: int, tp_rank: int) -> LoadedModel:
    """Keep this rank's vocabulary rows of the output layer and drop the full one."""
    head = model.get_output_embeddings()
    full = head.weight.detach()
    shard = vp.VocabShard(int(full.shape[0]), tp, tp_rank)
    weight = torch.zeros((shard.size, full.shape[1]), dtype=full.dtype, device=full.device)
    weight[: shard.valid] = full[shard.start: shard.start + shard.valid]
    bias = None
    if getattr(head, "bias", None) is not None:
        bias = torch.zeros(shard.size, dtype=head.bias.dtype, device=full.device)
        bias[: shard.valid] = head.bias.detach()[shard.start: shard.start + shard.valid]
    body = model.get_decoder()
    if not getattr(model.config, "tie_word_embeddings", False):
        model.set_output_embeddings(torch.nn.Identity())  # frees an untied full output layer
    softcap = getattr(model.config, "final_logit_softcapping", None)
    return LoadedModel(body.eval(), weight, bias, shard, float(softcap) if softcap else None, path)


class TeacherWorker:
    """Scores token sequences: next-token log-probs, samples per position, and label-token log-probs."""

    def __init__(self, *, tp: int, tp_rank: int, group: dist.ProcessGroup | None, dtype: str = "float32",
                 sample_chunk_size: int = 4096, label_chunk_size: int = 4096, seed: int = 0) -> None:
        self.tp, self.tp_rank, self.group, self.dtype = tp, tp_rank, group if tp > 1 else None, dtype
        self.sample_chunk_size, self.label_chunk_size = sample_chunk_size, label_chunk_size
        self.device = rank_device()
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.workspace = vp.Workspace()
        self.model: LoadedModel | None = None

    @property
    def vocab_size(self) -> int:
        assert self.model is not None
        return self.model.shard.vocab_size

    def load(self, path: str) -> None:
        """Load on every rank; swap in only if all TP peers succeeded (else the old model stays)."""
        error: BaseException | None = None
        try:
            new = shard_model(load_model_dir(path, self.dtype, self.device), path, self.tp, self.tp_rank)
        except Exception as exc:  # reported below, after the peers agree
            error, new = exc, None
        failed = torch.tensor([0 if error is None else 1])
        if self.group is not None:
            dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.group)
        if error is not None:
            raise RuntimeError(f"loading {path} failed: {error}") from error
        if int(failed):
            raise RuntimeError(f"loading {path} failed on a TP peer")
        self.model = new

    def local_logits(self, input_ids: list[int]) -> torch.Tensor:
        """[len-1, V/tp] logits of this rank's vocabulary slice for positions 0..len-2."""
        m = self.model
        assert m is not None, "no model loaded"
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        hidden = m.body(input_ids=ids).last_hidden_state[0, :-1]
        logits = hidden @ m.weight.T
        if m.bias is not None:
            logits += m.bias
        if m.softcap:
            logits = torch.tanh(logits / m.softcap) * m.softcap
        return logits

    @torch.no_grad()
    def score(self, input_ids: list[int], sample_n: int = 0, labels: list[list[int]] | None = None,
              temperature: float = 1.0) -> dict[str, list]:
        assert self.model is not None
        shard, group = self.model.shard, self.group
        local = self.local_logits(input_ids)
        stats = vp.global_stats(local, shard, group, temperature, self.sample_chunk_size, self.workspace)
        nxt = torch.tensor(input_ids[1:], dtype=torch.long, device=self.device)
        out: dict[str, list] = {"log_probs": vp.next_token_log_probs(
            local, nxt, shard, group, temperature, self.label_chunk_size, stats).tolist()}
        if sample_n:
            ids, logps = vp.sample(local, sample_n, shard, group, temperature, self.sample_chunk_size, stats,
                                   self.generator, self.workspace)
            out["sampled_token_ids"], out["sampled_log_probs"] = ids.tolist(), logps.tolist()
        if labels is not None:
            width = len(labels[0]) if labels else 0
            lab = torch.tensor(labels, dtype=torch.long, device=self.device).reshape(len(input_ids) - 1, width)
            out["label_token_log_probs"] = vp.label_log_probs(
                local, lab, shard, group, temperature, self.label_chunk_size, stats).tolist()
        return out
