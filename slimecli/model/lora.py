"""LoRA adapters in peft's on-disk format, without peft: what an engine needs to apply one.

A peft adapter directory holds ``adapter_config.json`` (r, lora_alpha, target_modules, ...) and
``adapter_model.safetensors`` whose keys are ``base_model.model.<module>.lora_A.weight`` ([r, in]) and
``...lora_B.weight`` ([out, r]). Merged into a linear layer's weight ``<module>.weight`` the adapter adds
``scaling * B @ A`` with scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"
# adapter_config.json settings this merge does not implement (peft's defaults are the plain LoRA it does)
_UNSUPPORTED: dict[str, Any] = {"use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "rank_pattern": {},
                "alpha_pattern": {}, "layers_to_transform": None}


def scaling(config: dict[str, Any]) -> float:
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise ValueError(f"{ADAPTER_CONFIG}: r must be a positive integer (got {r!r})")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0:
        raise ValueError(f"{ADAPTER_CONFIG}: lora_alpha must be a positive number (got {alpha!r})")
    return float(alpha) / (math.sqrt(r) if config.get("use_rslora") else r)


def check_config(config: Any) -> dict[str, Any]:
    """The adapter config if it is plain LoRA that a merge reproduces; ValueError naming the field otherwise."""
    if not isinstance(config, dict):
        raise ValueError(f"{ADAPTER_CONFIG}: must be a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{ADAPTER_CONFIG}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, plain in _UNSUPPORTED.items():
        if config.get(key) not in (plain, None, [], {}):
            raise ValueError(f"{ADAPTER_CONFIG}: {key}={config.get(key)!r} is not supported (only plain LoRA merges)")
    scaling(config)
    return config


def read_adapter(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json, the adapter's tensors) of a peft adapter directory."""
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / ADAPTER_CONFIG).is_file() or not (d / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{d} is not a peft adapter directory (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    config = check_config(json.loads((d / ADAPTER_CONFIG).read_text(encoding="utf-8")))
    return config, load_file(str(d / ADAPTER_WEIGHTS))


def pairs(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{the base weight's name (``<module>.weight``): (A, B)}; ValueError for a key that is not LoRA's."""
    out: dict[str, list[torch.Tensor | None]] = {}
    for key, t in tensors.items():
        if not key.startswith(PREFIX) or not key.endswith((_A, _B)):
            raise ValueError(f"{key!r} is not a LoRA tensor of peft's format ({PREFIX}<module>{_A} or {_B})")
        module = key[len(PREFIX):-len(_A)]
        slot = out.setdefault(f"{module}.weight", [None, None])
        slot[0 if key.endswith(_A) else 1] = t
    missing = [name for name, (a, b) in out.items() if a is None or b is None]
    if missing:
        raise ValueError(f"{missing[0]}: the adapter has lora_A or lora_B of this module but not both")
    return {name: (a, b) for name, (a, b) in out.items() if a is not None and b is not None}


def deltas(config: dict[str, Any], tensors: dict[str, torch.Tensor], base: dict[str, torch.Tensor]
           ) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """{base weight name: (A, B, scaling)} checked against ``base`` (name -> served tensor): every module the
    adapter names exists there with a shape that B @ A matches. ValueError names the first that does not."""
    scale = scaling(config)
    out = {}
    for name, (a, b) in pairs(tensors).items():
        target = base.get(name)
        if target is None:
            raise ValueError(f"{name!r}: the adapter targets a module the served model lacks")
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(target.shape):
            raise ValueError(f"{name!r}: lora_B {list(b.shape)} @ lora_A {list(a.shape)} does not make the served "
                             f"weight's shape {list(target.shape)}")
        out[name] = (a, b, scale)
    return out


def merged(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """base + scale * B @ A, computed in float32 and returned in the base's dtype."""
    delta = (b.to(torch.float32) @ a.to(torch.float32)) * scale
    return (base.to(torch.float32) + delta.to(base.device)).to(base.dtype)
