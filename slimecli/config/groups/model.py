from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec

Dtype = Literal["float32", "bfloat16", "float16"]  # the weights' dtype (model.dtype, teacher.dtype)


@dataclass(frozen=True)
class ModelConfig:
    """The policy model. `name=tiny` is created by slimecli itself when `path` is unset."""

    name: str = "tiny"
    path: str | None = None
    tokenizer_path: str | None = None  # defaults to `path`
    dtype: Dtype = "float32"
    cache_dir: str | None = None  # where model=tiny is created; None -> ~/.cache/slimecli
    seed: int = spec(0, note="any 64-bit int seeds torch")  # seed of the tiny model's random weights
    hidden_size: int = spec(64, gt=0)
    num_layers: int = spec(2, gt=0)
    num_heads: int = spec(4, gt=0)
    num_kv_heads: int = spec(2, gt=0)
    intermediate_size: int = spec(128, gt=0)
    max_position_embeddings: int = spec(65536, gt=0)  # tiny model: agent CLI prompts (~80k chars) need > 32k tokens
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
