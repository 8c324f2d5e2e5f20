"""HF export for update_weights_from_disk: a real HF dir that transformers loads, written atomically."""

from __future__ import annotations

import json

import pytest
import torch

from slimecli.train.hf_export import export_hf, export_version, prune_versions

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path_factory.mktemp("base")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    vocab = {"<unk>": 0, "<eos>": 1, **{chr(ord("a") + i): i + 2 for i in range(26)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(path)
    (path / "pytorch_model.bin.index.json").write_text("{}")  # a stale weight index must not be copied
    return path


def test_export_loads_in_transformers_with_new_weights(base_dir, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    out = export_hf(model.state_dict(), base_dir, tmp_path / "w" / "v1")
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "config.json" in names and "tokenizer.json" in names
    assert "pytorch_model.bin.index.json" not in names
    assert json.loads((out / "config.json").read_text()) == json.loads((base_dir / "config.json").read_text())
    assert [p.name for p in (tmp_path / "w").iterdir()] == ["v1"]  # no temp dir left
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_ids_to_tokens(tok("abc")["input_ids"]) == ["a", "b", "c"]


def test_export_replaces_an_existing_dir_and_casts(base_dir, tmp_path):
    state = transformers.AutoModelForCausalLM.from_pretrained(base_dir).state_dict()
    out = export_hf(state, base_dir, tmp_path / "v")
    (out / "marker").write_text("old")
    export_hf(state, base_dir, tmp_path / "v", dtype=torch.bfloat16)
    assert not (out / "marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16)
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16


def test_export_version_keeps_the_newest(base_dir, tmp_path):
    state = {"model.embed_tokens.weight": torch.zeros(32, 16)}
    for v in range(1, 5):
        export_version(state, base_dir, tmp_path, v, keep=2)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v3", "v4"]


def test_pruning_later_keeps_the_newest_and_exports_in_progress(base_dir, tmp_path):
    import os

    state = {"model.embed_tokens.weight": torch.zeros(32, 16)}
    paths = [export_version(state, base_dir, tmp_path, v, keep=None) for v in range(1, 5)]
    root = tmp_path / "weights"
    assert sorted(p.name for p in root.iterdir()) == ["v1", "v2", "v3", "v4"]  # nothing deleted on the way
    (root / f".tmp-v5-{os.getpid()}").mkdir()  # this process exporting the next version right now
    (root / ".tmp-v9-999999999").mkdir()  # left half-written by a trainer that is gone
    prune_versions(paths[2], keep=2)  # the engines hold v3; v4 is newer still
    assert sorted(p.name for p in root.iterdir()) == [f".tmp-v5-{os.getpid()}", "v3", "v4"]


def test_export_needs_a_hf_base(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        export_hf({"w": torch.ones(1)}, tmp_path, tmp_path / "out")
