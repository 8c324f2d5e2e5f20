"""The engine's own plain decoders (model/plain_decoder.py) against transformers' models: the same logits bit for
bit through everything the engine's runner does (padded prefill groups, a prefill after a cached prefix, decode
steps, rows leaving), per architecture and dtype; and what it refuses, it leaves to transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from slimecli.engine.kvcache import BatchCache
from slimecli.engine.prefix_cache import PrefixCache
from slimecli.engine.protocol import Item, SamplingParams
from slimecli.engine.runner import Runner
from slimecli.engine.seq import Seq
from slimecli.model.loading import load_serving_model
from slimecli.model.plain_decoder import PlainDecoderLM, plain_decoder_or_why

COMMON = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}


def checkpoint(root: Path, arch: str, **extra: object) -> Path:
    """A small random HF checkpoint directory of `arch`, as save_pretrained writes it."""
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(arch, **{**COMMON, **extra})
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms away from 1 and biases away from 0: a missed weight or bias shows in the logits
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    path = root / f"{arch}-{len(list(root.iterdir()))}"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def archs(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plain")
    return {"qwen3": tiny, "qwen3-bias": checkpoint(root, "qwen3", attention_bias=True),
            "llama": checkpoint(root, "llama", attention_bias=True, mlp_bias=True),
            "qwen2": checkpoint(root, "qwen2"), "mistral": checkpoint(root, "mistral", sliding_window=None),
            "tied": checkpoint(root, "llama", tie_word_embeddings=True)}


def seq(prompt: list[int]) -> Seq:
    item = Item(index=0, rid="r", prompt_ids=prompt, text=None, params=SamplingParams(temperature=0.0))
    return Seq(item=item, prompt_ids=prompt, eos_ids=frozenset())


def drive(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every logit row a runner gets for a fixed script: a padded group, a row joining mid-batch, a prompt that
    extends a cached prefix, decode steps (teacher-forced), a row leaving."""
    runner = Runner(model, pad_id=0, prefix_cache=PrefixCache(1 << 24, min_tokens=4))
    out = [runner.prefill([seq([5, 6, 7, 8, 9, 10, 11]), seq([12, 13]), seq([14, 15, 16])])]
    for step, rows in enumerate(([20, 21, 22], [23, 24, 25], [26, 28])):
        for s, tok in zip(runner.rows, rows, strict=True):
            s.output_ids.append(tok)
        out.append(runner.decode())
        if step == 1:
            runner.remove([True, False, True])  # the padding columns shift; the leaving row's keys are cached
    out.append(runner.prefill([seq([12, 13, 23, 40, 41, 42])]))  # its first 4 tokens from the prefix cache
    for s in runner.rows:
        s.output_ids.append(50)
    out.append(runner.decode())
    whole = seq(list(range(3, 20)))
    whole.item.return_logprob, whole.item.logprob_start_len = True, 0
    runner.score(whole)  # logits at every prompt position
    out.append(torch.tensor(whole.input_logprobs[1:]))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen3", "qwen3-bias", "llama", "qwen2", "mistral", "tied"])
def test_same_logits_as_transformers_bit_for_bit(archs: dict[str, Path], arch: str, dtype: torch.dtype) -> None:
    path = archs[arch]
    ours, why = plain_decoder_or_why(path, dtype)
    assert isinstance(ours, PlainDecoderLM), why
    theirs = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa").eval()
    assert {k: (v.shape, v.dtype) for k, v in ours.state_dict().items()} == {
        k: (v.shape, v.dtype) for k, v in theirs.state_dict().items()}  # weight updates address the same names
    tied = [m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr() for m in (ours, theirs)]
    assert tied[0] == tied[1] == bool(ours.config.tie_word_embeddings) == (arch in ("qwen3", "tied"))
    for step, (a, b) in enumerate(zip(drive(ours), drive(theirs), strict=True)):
        assert torch.equal(a, b), (step, (a.float() - b.float()).abs().max())
    with torch.inference_mode():  # the forward without a cache, as a teacher or a test would call it
        ids = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 7, 8, 9, 10]])
        mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
        assert torch.equal(ours(input_ids=ids, attention_mask=mask, use_cache=False).logits,
                           theirs(input_ids=ids, attention_mask=mask, use_cache=False).logits)


def test_refuses_what_it_does_not_reproduce(tmp_path: Path, archs: dict[str, Path]) -> None:
    """Each refusal names why; load_serving_model then loads with transformers (the same logits either way)."""
    assert "sliding-window" in plain_decoder_or_why(checkpoint(tmp_path, "mistral", sliding_window=4),
                                                    torch.float32)[1]
    scaled = checkpoint(tmp_path, "llama", rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert "rope type 'linear'" in plain_decoder_or_why(scaled, torch.float32)[1]
    assert "model_type 'gpt2'" in plain_decoder_or_why(checkpoint(tmp_path, "gpt2", n_embd=32, n_layer=1, n_head=2),
                                                    torch.float32)[1]
    custom = tmp_path / "custom"
    custom.mkdir()
    for f in archs["qwen2"].iterdir():
        (custom / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((custom / "config.json").read_text())
    (custom / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModelForCausalLM": "x.Y"}}))
    assert "auto_map" in plain_decoder_or_why(custom, torch.float32)[1]
    (custom / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(custom / "model.safetensors"))
    tensors["model.layers.0.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(custom / "model.safetensors"))
    assert "model.layers.0.extra.weight" in plain_decoder_or_why(custom, torch.float32)[1]
    fallback = load_serving_model(scaled)
    assert not isinstance(fallback, PlainDecoderLM)
    cache = BatchCache(len(fallback.model.layers))
    with torch.inference_mode():
        assert fallback(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=cache).logits.shape == (1, 3, 300)


def test_sharded_checkpoints_load(tmp_path: Path, archs: dict[str, Path]) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(archs["qwen2"]))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours, why = plain_decoder_or_why(tmp_path / "sharded", torch.float32)
    assert ours is not None, why
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_server_loads_it_without_transformers_model_code(tiny: Path) -> None:
    """The point of it: transformers' model code (1.4 CPU-seconds of imports) stays out of the server."""
    code = ("import sys; from slimecli.model.loading import load_serving_model; "
            f"m = load_serving_model({str(tiny)!r}); print(type(m).__name__, "
            "sorted(k for k in sys.modules if k == 'transformers.modeling_utils' or '.modeling_qwen' in k))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["PlainDecoderLM", "[]"]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3-bias", "llama", "qwen2", "mistral", "tied"])
def test_the_module_names_from_config_json_are_transformers_own(archs: dict[str, Path], arch: str) -> None:
    """model/plain_arch.py lists a plain decoder's modules from its config.json (the controller's LoRA pre-flight,
    without torch): the names and classes transformers builds; anything else is left to transformers."""
    from slimecli.launch.lora_checks import module_kinds as preflight_kinds
    from slimecli.model.plain_arch import module_kinds

    config = json.loads((archs[arch] / "config.json").read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(archs[arch]))
    built = {name: ("Linear" if isinstance(m, torch.nn.Linear) else type(m).__name__)
             for name, m in model.named_modules() if name}
    assert module_kinds(config) == built == preflight_kinds(str(archs[arch]))
    for other in ({"auto_map": {"AutoModelForCausalLM": "x.Y"}}, {"hidden_act": "gelu"},
                  {"quantization_config": {"quant_method": "fp8"}}, {"model_type": "gpt_neox"}):
        assert module_kinds({**config, **other}) is None
