"""One teacher rank: an HF causal LM whose output layer is sharded by vocabulary across the TP group.

With teacher.backend=torch every rank runs the whole model body and multiplies the last hidden states by its
own [V/tp, H] slice of the output layer, so no rank holds more than [N, V/tp] logits; teacher.backend=megatron
splits the body too (megatron_body.py). All ranks of a TP group must call `score`/`load` with the same
arguments.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from slimecli.teacher import vocab_parallel as vp

# Logits / temperature beyond this overflow the float32 maths of the scoring (exp, log-sum-exp).
MAX_SCALED_LOGIT = 1e30


class RequestInvalid(ValueError):
    """Input the maths is not defined for, found alike on every rank of the group: the client's fault (400)."""


class TeacherModel(Protocol):
    shard: vp.VocabShard
    path: str
    collective_forward: bool  # the forward itself runs TP collectives (a failure inside it strands the peers)

    def local_logits(self, input_ids: list[int]) -> torch.Tensor: ...


@dataclass
class LoadedModel:
    body: Any  # the decoder stack (returns last hidden states, final norm applied)
    weight: torch.Tensor  # [V/tp, H] this rank's rows of the output layer (padding rows are zero)
    bias: torch.Tensor | None
    shard: vp.VocabShard
    softcap: float | None
    path: str
    collective_forward: bool = False

    def local_logits(self, input_ids: list[int]) -> torch.Tensor:
        """[len-1, V/tp] logits of this rank's vocabulary slice for positions 0..len-2."""
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.weight.device)
        hidden = self.body(input_ids=ids).last_hidden_state[0, :-1]
        logits = hidden @ self.weight.T
        if self.bias is not None:
            logits += self.bias
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


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
                 sample_chunk_size: int = 4096, label_chunk_size: int = 4096, seed: int = 0,
                 backend: str = "torch", trust_remote_code: bool = False) -> None:
        self.tp, self.tp_rank, self.group, self.dtype = tp, tp_rank, group if tp > 1 else None, dtype
        self.backend, self.seed, self.trust_remote_code = backend, seed, trust_remote_code
        self.sample_chunk_size, self.label_chunk_size = sample_chunk_size, label_chunk_size
        self.device = rank_device()
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.workspace = vp.Workspace()
        self.model: TeacherModel | None = None
        # True while a failure would leave TP peers inside a collective: then the rank must die, not answer.
        self.in_collective = False

    @property
    def vocab_size(self) -> int:
        assert self.model is not None
        return self.model.shard.vocab_size

    def load(self, path: str) -> None:
        """Load on every rank; swap in only if all TP peers succeeded (else the old model stays)."""
        error: BaseException | None = None
        new: TeacherModel | None
        try:
            new = self._build(path)
        except Exception as exc:  # noqa: BLE001 - reported below, after the peers agree
            error, new = exc, None
        failed = torch.tensor([0 if error is None else 1])
        if self.group is not None:
            dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.group)
        if error is not None:
            raise RuntimeError(f"loading {path} failed: {error}") from error
        if int(failed):
            raise RuntimeError(f"loading {path} failed on a TP peer")
        self.model = new

    def _build(self, path: str) -> TeacherModel:
        if self.backend == "megatron":
            from slimecli.teacher.megatron_body import load_megatron

            return load_megatron(path, self.dtype, self.device, self.tp, self.tp_rank, self.seed,
                                 self.trust_remote_code)
        return shard_model(load_model_dir(path, self.dtype, self.device), path, self.tp, self.tp_rank)

    def local_logits(self, input_ids: list[int]) -> torch.Tensor:
        assert self.model is not None, "no model loaded"
        return self.model.local_logits(input_ids)

    @torch.no_grad()
    def score(self, input_ids: list[int], sample_n: int = 0, labels: list[list[int]] | None = None,
              temperature: float = 1.0, fail_at: str | None = None) -> dict[str, list]:
        """Every rank of the group gets the same arguments, so the checks before the first collective give the
        same answer everywhere; what only one rank can see (its logits, its own failure) is agreed on in one
        all-reduce before the vocab-parallel collectives start. `fail_at` (a test hook: "forward" or
        "collective") makes this rank raise there, as a rank-local fault would."""
        assert self.model is not None
        self.in_collective = False
        shard, group = self.model.shard, self.group
        check_request(input_ids, sample_n, labels, temperature, shard.vocab_size)
        self.in_collective = self.model.collective_forward and group is not None
        error: Exception | None = None
        try:
            if fail_at == "forward":
                raise RuntimeError("test fault in the forward (test_fail)")
            local = self.local_logits(input_ids)
            peak = float(local.abs().amax()) if local.numel() else 0.0
        except Exception as exc:  # agreed on below when the forward is rank-local
            if self.in_collective:
                raise
            error, peak = exc, 0.0
        flags = torch.tensor([error is not None, not math.isfinite(peak), peak / temperature > MAX_SCALED_LOGIT],
                             dtype=torch.int32)
        if group is not None:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        if error is not None:
            raise error
        if flags[0]:
            raise RuntimeError("the forward failed on a TP peer (see its log)")
        if flags[1]:
            raise RuntimeError("the model produced non-finite logits")
        if flags[2]:
            raise RequestInvalid(f"temperature={temperature!r} is too small for this model's logits "
                                 f"(logit / temperature overflows float32)")
        self.in_collective = group is not None
        if fail_at == "collective":
            raise RuntimeError("test fault between the TP collectives (test_fail)")
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
        self.in_collective = False
        return out


def check_request(input_ids: list[int], sample_n: int, labels: list[list[int]] | None, temperature: float,
                  vocab_size: int) -> None:
    """The front validates requests already; this is the ranks' own guard, computed from the message alone."""
    if len(input_ids) < 2:
        raise RequestInvalid("input_ids needs at least 2 tokens")
    if not all(isinstance(t, int) and 0 <= t < vocab_size for t in input_ids):
        raise RequestInvalid(f"input_ids must be token ids in [0, {vocab_size})")
    if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0):
        raise RequestInvalid(f"temperature must be a finite number > 0, got {temperature!r}")
    if not isinstance(sample_n, int) or sample_n < 0:
        raise RequestInvalid(f"sample_n must be an integer >= 0, got {sample_n!r}")
    if labels is not None:
        if len(labels) != len(input_ids) - 1 or len({len(row) for row in labels}) > 1:
            raise RequestInvalid("label_token_ids needs one row per position, all of the same length")
        if not all(isinstance(t, int) and 0 <= t < vocab_size for row in labels for t in row):
            raise RequestInvalid(f"label_token_ids must be token ids in [0, {vocab_size})")
