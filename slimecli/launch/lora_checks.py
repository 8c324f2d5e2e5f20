"""Pre-flight of trainer.lora against the model at model.path: every target module must be a linear layer of it.

The config rules know the module names of the presets only (model=tiny, qwen3_0_6b without a path); a model.path
may hold any architecture transformers builds. The plain decoders' module names follow from config.json alone
(model/plain_arch.py: no torch in the controller); any other model is built here from its config.json on the meta
device: no weight is read and no memory is taken, whatever its size. Linear layers only, because they are what the engines
take: the embedded engine merges W + scale * B A into a weight [out, in], SGLang serves adapters on linear layers.
"""

from __future__ import annotations

import json
from pathlib import Path

from slimecli.config.errors import NO_VALUE, ConfigError, did_you_mean
from slimecli.config.schema import SlimeConfig

KEY = "trainer.lora.target_modules"


def module_kinds(model_dir: str, trust_remote_code: bool = False) -> dict[str, str]:
    """Every module of the model at ``model_dir`` by its dotted name, with its class name: read from config.json for
    the plain decoders (model/plain_arch.py), else built on the meta device from config.json alone."""
    from slimecli.model.plain_arch import module_kinds as plain_module_kinds

    config_file = Path(model_dir) / "config.json"
    if config_file.is_file():
        try:
            plain = plain_module_kinds(json.loads(config_file.read_text()))
        except (OSError, ValueError):
            plain = None  # transformers says what is wrong with it
        if plain is not None:
            return plain
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, trust_remote_code=trust_remote_code)
    return {name: ("Linear" if isinstance(m, torch.nn.Linear) else type(m).__name__)
            for name, m in model.named_modules() if name}


def target_errors(targets: tuple[str, ...], kinds: dict[str, str], where: str) -> list[ConfigError]:
    """Each target (a module name or a dotted suffix of one, as peft matches them) that names no linear layer."""
    linear = sorted({name.rsplit(".", 1)[-1] for name, kind in kinds.items() if kind == "Linear"})
    listing = f"the linear layers of {where}: {', '.join(linear) or 'none'}"
    errors = []
    for target in targets:
        found = {kind for name, kind in kinds.items() if name == target or name.endswith(f".{target}")}
        if "Linear" in found:
            continue
        if found:
            errors.append(ConfigError(KEY, target, f"is not a linear layer in {where} (its class: "
                                      f"{', '.join(sorted(found))}); the engines take adapters on linear layers only",
                                      listing))
        else:
            errors.append(ConfigError(KEY, target, f"{where} has no module of that name",
                                      did_you_mean(target, linear) or listing))
    return errors


def lora_module_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """trainer.lora with a model.path: its target modules against that model's own modules."""
    lo, model = cfg.trainer.lora, cfg.model
    if not lo.enabled or model.path is None:
        return []  # off, or a preset whose names the config rules checked
    try:
        kinds = module_kinds(model.path, model.trust_remote_code)
    except Exception as exc:  # noqa: BLE001  # any failure to build it is the answer, named
        return [ConfigError("model.path", model.path, "cannot build the model from its config.json to read its "
                            f"module names for trainer.lora ({type(exc).__name__}: {exc})",
                            "point model.path at a Hugging Face causal-LM checkpoint")]
    where = f"the model at {model.path}"
    errors = target_errors(lo.targets(model.name), kinds, where)
    if errors and lo.target_modules is None:  # the defaults, not the user's names: one error that says so
        missing = ", ".join(str(e.value) for e in errors)
        return [ConfigError(KEY, NO_VALUE, f"unset, so the defaults ({', '.join(lo.targets(model.name))}) apply, "
                            f"and {where} has no linear layer named {missing}", "set trainer.lora.target_modules to some of "
                            + errors[0].hint.removeprefix(f"the linear layers of {where}: "))]
    return errors
