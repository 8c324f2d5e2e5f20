"""The tiny model is a real HF checkpoint: transformers loads it, it is deterministic, its tokenizer is byte-level."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from slimecli.model.tiny import create_tiny_model
from slimecli.model.tokenizer import SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parent.parent




def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_transformers_loads_it(tiny: Path, tok) -> None:
    cfg = AutoConfig.from_pretrained(str(tiny))
    assert cfg.model_type == "qwen3"
    model = AutoModelForCausalLM.from_pretrained(str(tiny), attn_implementation="sdpa").eval()
    assert model.config._attn_implementation == "sdpa"
    assert len(tok) <= cfg.vocab_size <= 8192
    ids = tok("def f(x):\n    return {\"a\": 1}", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], cfg.vocab_size)
    assert torch.isfinite(logits).all()
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for t in SPECIAL_TOKENS:  # each is one token
        assert len(tok(t, add_special_tokens=False).input_ids) == 1, t


def test_every_tensor_is_one_transformers_expects(tmp_path: Path) -> None:
    """The tensors' names and shapes come from the engine's own model of Qwen3 (tiny.py): transformers' model of the
    same config must take each of them, none missing, none left over, none of another shape."""
    path = create_tiny_model(tmp_path / "wide", hidden_size=128, num_layers=3, num_heads=8, num_kv_heads=2,
                             intermediate_size=96)
    _, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("model.layers.2.self_attn.k_proj.weight").get_shape() == [32, 128]  # 2 kv heads of 16
        assert f.get_slice("model.layers.2.mlp.down_proj.weight").get_shape() == [128, 96]


def test_deterministic_from_seed(tiny: Path, tmp_path: Path) -> None:
    again = create_tiny_model(tmp_path / "again", seed=0)
    other = create_tiny_model(tmp_path / "other", seed=1)
    assert _digest(again / "model.safetensors") == _digest(tiny / "model.safetensors")
    assert _digest(other / "model.safetensors") != _digest(tiny / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
        assert (other / name).read_bytes() == (tiny / name).read_bytes(), name


def test_tokenizer_same_in_another_process(tiny: Path) -> None:
    code = ("import hashlib; from slimecli.model.tokenizer import build_tokenizer; "
            "print(hashlib.sha256(build_tokenizer().to_str().encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "RAYON_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    from tokenizers import Tokenizer

    here = Tokenizer.from_file(str(tiny / "tokenizer.json")).to_str()
    assert out.stdout.strip() == hashlib.sha256(here.encode()).hexdigest()


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips(tok, text: str) -> None:
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text


def test_unicode_and_bytes_round_trip(tok) -> None:
    for text in ["naïve café — 東京 🚀\u200b", "\x00\x01\t\r\n", "  leading and trailing  ", "ﬁ\U0010ffff"]:
        assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    assert tok.unk_token_id is None


def test_compresses_english_json_and_code(tok) -> None:
    text = (ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else ""
    text += (ROOT / "slimecli" / "model" / "loading.py").read_text()
    text += json.dumps({"type": "object", "properties": {"file_path": {"type": "string", "description":
                        "The absolute path to the file to read"}}, "required": ["file_path"]})
    ratio = len(text) / len(tok(text, add_special_tokens=False).input_ids)
    assert ratio > 2.0, ratio
