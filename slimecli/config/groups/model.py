from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dtype = Literal["float32", "bfloat16", "float16"]  # the weights' dtype (model.dtype, teacher.dtype)


@dataclass(frozen=True)
class ModelConfig:
    """The policy model. `name=tiny` is created by slimecli itself when `path` is unset."""

    name: str = "tiny"
    path: str | None = None
    tokenizer_path: str | None = None  # defaults to `path`
    dtype: Dtype = "float32"
    cache_dir: str | None = None  # where model=tiny is created; None -> ~/.cache/slimecli
    seed: int = 0  # seed of the tiny model's random weights
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 65536  # tiny model: agent CLI prompts (~80k chars) need > 32k tokens
    trust_remote_code: bool = False

    @property
    def resolved_path(self) -> str:
        """`path` of a config the controller materialized (workers only ever see those)."""
        if self.path is None:
            raise ValueError("model.path is unset: the controller resolves it (model=tiny is created) before "
                             "any worker starts")
        return self.path

    @property
    def resolved_tokenizer_path(self) -> str:
        return self.tokenizer_path or self.resolved_path
