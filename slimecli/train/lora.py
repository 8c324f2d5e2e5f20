"""trainer.lora on trainer=torch: peft's LoRA around the Hugging Face model.

Only the adapters are trainable, so only they get optimizer state. What leaves the trainer (the weight push,
checkpoints, final/) is the adapter alone, in peft's file format (slimecli.model.lora); the reference model
of the KL terms is the same model with its adapters switched off, so no second copy is loaded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, cast

import torch

from slimecli.config.schema import SlimeConfig
from slimecli.model.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX
from slimecli.train.batch import PackedBatch
from slimecli.train.dist import unwrap

ADAPTER = "default"  # peft's name of the one adapter


def wrap(model: torch.nn.Module, cfg: SlimeConfig) -> torch.nn.Module:
    """The model with LoRA adapters on trainer.lora.target_modules; the base weights frozen."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, peft_config(cfg))
    if cfg.trainer.gradient_checkpointing:  # the frozen embeddings' output must carry grad for the adapters'
        peft_model.enable_input_require_grads()
    return cast(torch.nn.Module, peft_model)


def peft_config(cfg: SlimeConfig) -> Any:
    from peft import LoraConfig

    lo = cfg.trainer.lora
    return LoraConfig(r=lo.rank, lora_alpha=lo.alpha, lora_dropout=lo.dropout,
                      target_modules=list(lo.targets(cfg.model.name)), init_lora_weights=True if lo.init == "default" else "gaussian", task_type="CAUSAL_LM",
                      base_model_name_or_path=cfg.model.resolved_path)


def wire_config(cfg: SlimeConfig) -> dict[str, Any]:
    """The adapter_config.json fields an engine needs to merge the adapter (sent with a shared-memory push)."""
    lo = cfg.trainer.lora
    return {"peft_type": "LORA", "r": lo.rank, "lora_alpha": lo.alpha, "use_rslora": False,
            "target_modules": list(lo.targets(cfg.model.name))}


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def to_file_key(name: str) -> str:
    """A PeftModel state-dict key (``...q_proj.lora_A.default.weight``) in peft's file format (no adapter name)."""
    return name.replace(f".lora_A.{ADAPTER}.", ".lora_A.").replace(f".lora_B.{ADAPTER}.", ".lora_B.")


def to_model_key(name: str) -> str:
    return name.replace(".lora_A.", f".lora_A.{ADAPTER}.").replace(".lora_B.", f".lora_B.{ADAPTER}.")


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a PeftModel's state dict, in peft's file format, detached on the CPU (copies)."""
    return {to_file_key(k): v.detach().to("cpu", copy=True) for k, v in state.items() if is_adapter_key(k)}


def model_keys(adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Counterpart of adapter_state: peft's file format back to the PeftModel's keys; ValueError for a key that
    is not an adapter tensor (a full-model checkpoint handed to a LoRA run)."""
    wrong = [k for k in adapter if not (k.startswith(PREFIX) and is_adapter_key(k))]
    if wrong:
        raise ValueError(f"{wrong[0]!r} is not a LoRA adapter tensor: this checkpoint was not written by a "
                         "trainer.lora run (resume it with trainer.lora.rank=0)")
    return {to_model_key(k): v for k, v in adapter.items()}


def write_adapter(adapter: dict[str, torch.Tensor], cfg: SlimeConfig, out_dir: str | Path,
                  with_tokenizer: bool = False) -> Path:
    """``out_dir`` as peft writes an adapter (adapter_config.json, adapter_model.safetensors), built in a temp dir
    and renamed into place so that an engine told to load it never sees a partial one."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        peft_config(cfg).save_pretrained(str(tmp))
        save_file({k: v.contiguous() for k, v in adapter.items()}, str(tmp / ADAPTER_WEIGHTS),
                  metadata={"format": "pt"})
        if with_tokenizer:
            base = Path(cfg.model.resolved_tokenizer_path)
            for f in base.iterdir():
                if f.is_file() and ("token" in f.name or f.name in ("chat_template.jinja", "special_tokens_map.json")):
                    shutil.copy2(f, tmp / f.name)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    assert (out / ADAPTER_CONFIG).is_file()
    return out


def merged_state(model: torch.nn.Module, full: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The base model's weights with the adapters merged in, under the base model's own (HF) names.

    ``full``: the PeftModel's whole state dict (gathered, for a sharded model); else the model's own.
    """
    from slimecli.model.lora import merged

    peft_model: Any = model
    state = full if full is not None else {k: v.detach() for k, v in model.state_dict().items()}
    cfg = peft_model.peft_config[ADAPTER]
    scale = float(cfg.lora_alpha) / (cfg.r ** 0.5 if cfg.use_rslora else cfg.r)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if is_adapter_key(key):
            continue
        name = key[len(PREFIX):] if key.startswith(PREFIX) else key
        name = name.replace(".base_layer.", ".")
        module = key[:-len(".base_layer.weight")] if key.endswith(".base_layer.weight") else None
        if module is not None and f"{module}.lora_A.{ADAPTER}.weight" in state:
            a, b = state[f"{module}.lora_A.{ADAPTER}.weight"], state[f"{module}.lora_B.{ADAPTER}.weight"]
            value = merged(value, a, b, scale)
        out[name] = value.detach().cpu()
    return out


def untie_if_head_merged(merged_dir: Path, state: dict[str, torch.Tensor]) -> None:
    """An adapter on a tied output layer makes lm_head differ from the embeddings: say so in config.json, or
    transformers would tie them again on load and drop the merged head."""
    import json

    head, embed = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
    if head is None or embed is None or torch.equal(head, embed):
        return
    path = merged_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tie_word_embeddings", False):
        config["tie_word_embeddings"] = False
        path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a PeftModel (the model itself otherwise)."""
    get = getattr(model, "get_base_model", None)
    return cast(torch.nn.Module, get()) if callable(get) else model


class AdapterOffPolicy:
    """The reference policy of a LoRA run: the trained model's forward with its adapters disabled (the base)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.data_rank, self.data_size = policy.data_rank, policy.data_size

    @torch.no_grad()
    def score(self, chunks: list[PackedBatch], temperature: float) -> list[torch.Tensor]:
        peft_model: Any = unwrap(self.policy.model)
        with peft_model.disable_adapter():
            return cast(list[torch.Tensor], self.policy.score(chunks, temperature))
