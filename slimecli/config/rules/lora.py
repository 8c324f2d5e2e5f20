"""trainer.lora against the back-end, the engines and the model's module names."""

from __future__ import annotations

from slimecli.config.errors import ConfigError, did_you_mean
from slimecli.config.groups.lora import ARCHITECTURE_MODULES, PRESET_ARCHITECTURES
from slimecli.config.schema import SlimeConfig


def module_errors(targets: tuple[str, ...], known: tuple[str, ...], where: str) -> list[ConfigError]:
    """Each target module that ``known`` (the model's module names) lacks, with a did-you-mean."""
    errors = []
    if not targets:
        errors.append(ConfigError("trainer.lora.target_modules", [], "must name at least one module",
                                  f"the modules of {where}: {', '.join(known)}"))
    for name in targets:
        if name not in known:
            hint = did_you_mean(name, known, "") or f"the modules of {where}: {', '.join(known)}"
            errors.append(ConfigError("trainer.lora.target_modules", name, f"{where} has no module of that name",
                                      hint))
    return errors


def lora(cfg: SlimeConfig) -> list[ConfigError]:
    t, lo = cfg.trainer, cfg.trainer.lora
    errors: list[ConfigError] = []
    if not lo.enabled:
        return errors
    if t.name == "megatron":
        errors.append(ConfigError("trainer.lora.rank", lo.rank,
                                  "trainer=megatron has no LoRA: peft wraps Hugging Face modules, and megatron-core "
                                  "builds its own layers (the adapters would have no module to attach to)",
                                  "use trainer=torch (DDP or FSDP) for LoRA, or trainer.lora.rank=0"))
    if t.weight_sync == "nccl":
        errors.append(ConfigError("trainer.weight_sync", "nccl",
                                  "with trainer.lora the engines get adapters, which travel as a peft directory "
                                  "(SGLang's /load_lora_adapter) or through shared memory; SGLang's weight-update "
                                  "group carries whole-model tensors only",
                                  "use trainer.weight_sync=disk (any engine) or shared_memory (embedded engines)"))
    if cfg.rollout.name == "sglang" and cfg.rollout.generate == "agent":
        errors.append(ConfigError("trainer.lora.rank", lo.rank,
                                  "an SGLang engine serves an adapter only to requests that name it (lora_path), "
                                  "and the agent adapter's requests do not name one yet",
                                  "use rollout=local (it merges the adapter into its weights), or trainer.lora.rank=0"))
    architecture = PRESET_ARCHITECTURES.get(cfg.model.name) if cfg.model.path is None else None
    if architecture is not None:  # a model.path, whatever its architecture, is checked in pre-flight (lora_checks)
        errors.extend(module_errors(lo.targets(cfg.model.name), ARCHITECTURE_MODULES[architecture], f"model={cfg.model.name}"))
    return errors


RULES = [lora]
