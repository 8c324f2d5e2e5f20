"""The HF <-> megatron-core weight converter (slimecli/model/megatron/convert.py), checked on its own.

Round trips and TP shards need only torch and transformers: every tensor, norms and biases included, is random
(no two alike), so a swapped, transposed or mis-grouped tensor cannot come back equal by chance. The vocabulary
is 4093, so TP=2 has to pad it. The logits check builds megatron-core's GPTModel in this process (world size 1,
gloo, the CPU shim) through the teacher's loader, the same build_model the trainer uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from slimecli.model.megatron.convert import arch_from_hf, hf_to_megatron, megatron_to_hf, shard, unshard

VOCAB = 4093
SMALL: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             rms_norm_eps=1e-6)
# together: q/k norm, tied and untied, qkv bias, head_dim != hidden / heads, GQA at 2 and 4 heads a group, rope theta
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3-tied": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True, head_dim=16)),
    "qwen3-untied": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=False, head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False, rope_theta=1e6)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False, num_attention_heads=8, head_dim=16,
                                                      rope_theta=5e5)),
}
# TP layout of megatron-core's parameters (column-parallel 0, row-parallel 1, replicated None)
PARTITION = {"word_embeddings": 0, "output_layer": 0, "linear_qkv": 0, "linear_fc1": 0, "linear_proj": 1,
             "linear_fc2": 1}


def hf_config(family: str):
    import transformers

    cls, arch, extra = FAMILIES[family]
    return getattr(transformers, cls)(**{**SMALL, **extra, "architectures": [arch]})


def hf_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny HF model whose every tensor is random (norms around 1, weights large enough for sharp attention)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(family), attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head is the embedding, listed once
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise)
    return model


def hf_state(family: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in hf_model(family).state_dict().items()}


def partition_dim(name: str) -> int | None:
    return next((d for key, d in PARTITION.items() if f"{key}." in name), None)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_megatron_hf_round_trip_is_bit_identical(family, tp):
    """HF -> Megatron -> TP shards -> Megatron -> HF returns every key, bit for bit, and nothing else."""
    hf = hf_state(family)
    arch = arch_from_hf(hf_config(family), tp)
    assert arch.padded_vocab_size == (VOCAB if tp == 1 else VOCAB + 1)
    meg = hf_to_megatron(hf, arch)
    assert ("output_layer.weight" in meg) == (not arch.tied)
    whole = {n: unshard(n, [shard(n, t, partition_dim(n), r, tp) for r in range(tp)], partition_dim(n))
             for n, t in meg.items()}
    back = megatron_to_hf(whole, arch)
    assert set(back) == set(hf), f"lost {set(hf) - set(back)}, added {set(back) - set(hf)}"
    for name, want in hf.items():
        assert back[name].dtype == want.dtype and torch.equal(back[name], want), name


@pytest.mark.parametrize("family", FAMILIES)
def test_megatron_layout_matches_megatron_cores_conventions(family):
    """qkv interleaved per query group [q heads; k; v], fc1 = [gate; up], vocabulary padded with zero rows."""
    hf, arch = hf_state(family), arch_from_hf(hf_config(family), 2)
    meg = hf_to_megatron(hf, arch)
    per, d = arch.num_heads // arch.num_kv_heads, arch.head_dim
    attn, m = "model.layers.1.self_attn.", "decoder.layers.1."
    qkv = meg[m + "self_attention.linear_qkv.weight"].reshape(arch.num_kv_heads, (per + 2) * d, -1)
    for g in range(arch.num_kv_heads):
        assert torch.equal(qkv[g, :per * d], hf[attn + "q_proj.weight"][g * per * d:(g + 1) * per * d])
        assert torch.equal(qkv[g, per * d:(per + 1) * d], hf[attn + "k_proj.weight"][g * d:(g + 1) * d])
        assert torch.equal(qkv[g, (per + 1) * d:], hf[attn + "v_proj.weight"][g * d:(g + 1) * d])
    fc1 = meg[m + "mlp.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([hf["model.layers.1.mlp.gate_proj.weight"],
                                       hf["model.layers.1.mlp.up_proj.weight"]]))
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if name in meg:
            assert meg[name].shape[0] == VOCAB + 1 and not meg[name][VOCAB:].any(), name


@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_shards_hold_what_each_rank_computes_and_reassemble_to_tp1(family):
    """Rank r of 2 holds query group r whole (its q heads, k, v, biases), gate and up rows r, the input columns
    r of o_proj and down_proj, and half the padded vocabulary; the shards put back together equal TP=1."""
    hf = hf_state(family)
    tp1 = hf_to_megatron(hf, arch_from_hf(hf_config(family), 1))
    arch = arch_from_hf(hf_config(family), 2)
    meg = hf_to_megatron(hf, arch)
    parts = {n: [shard(n, t, partition_dim(n), r, 2) for r in range(2)] for n, t in meg.items()}
    for n, ps in parts.items():
        assert all(p.is_contiguous() for p in ps), n  # gloo sends wrong elements of non-contiguous views
        whole = unshard(n, ps, partition_dim(n))
        rows = VOCAB if "word_embeddings" in n or "output_layer" in n else whole.shape[0]
        assert torch.equal(whole[:rows], tp1[n]), n
    half_q, half_kv = arch.num_heads // 2 * arch.head_dim, arch.num_kv_heads // 2 * arch.head_dim
    half_ffn = arch.ffn_hidden_size // 2
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        suffixes = ("weight", "bias") if arch.qkv_bias else ("weight",)
        for r in range(2):
            for s in suffixes:
                q, k, v = (hf[f"{h}self_attn.{x}_proj.{s}"] for x in "qkv")
                want = torch.cat([q[r * half_q:(r + 1) * half_q], k[r * half_kv:(r + 1) * half_kv],
                                  v[r * half_kv:(r + 1) * half_kv]])
                assert torch.equal(parts[m + f"self_attention.linear_qkv.{s}"][r], want), (m, s, r)
            gate, up = hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]
            rows = slice(r * half_ffn, (r + 1) * half_ffn)
            assert torch.equal(parts[m + "mlp.linear_fc1.weight"][r], torch.cat([gate[rows], up[rows]]))
            assert torch.equal(parts[m + "mlp.linear_fc2.weight"][r], hf[h + "mlp.down_proj.weight"][:, rows])
            o_cols = slice(r * half_q, (r + 1) * half_q)
            o_proj = hf[h + "self_attn.o_proj.weight"]
            assert torch.equal(parts[m + "self_attention.linear_proj.weight"][r], o_proj[:, o_cols])
            assert torch.equal(parts[m + "input_layernorm.weight"][r], hf[h + "input_layernorm.weight"])
    emb = parts["embedding.word_embeddings.weight"]
    assert [p.shape[0] for p in emb] == [(VOCAB + 1) // 2] * 2 and not emb[1][-1].any()


@pytest.mark.parametrize("config", [dict(attention_bias=True), dict(mlp_bias=True)])
def test_biases_megatron_cannot_hold_are_refused_not_dropped(config):
    """Llama with o_proj or MLP biases: the local megatron-core model has nowhere to put them, so the converter
    names them instead of silently converting a different model."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(**SMALL, **config, architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match="bias"):
        arch_from_hf(cfg)


# megatron-core in its own process: its CPU shim and parallel groups are process-wide and must not leak into the
# tests that run after this one in the same pytest process
MEGATRON_LOGITS = """
import os, sys, torch
from slimecli.teacher.megatron_body import load_megatron
model_dir, ids, out = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
with torch.no_grad():
    torch.save(load_megatron(model_dir, "float32", torch.device("cpu"), 1, 0, seed=0).local_logits(ids), out)
"""


def megatron_logits(model_dir: Path, ids: list[int], out: Path) -> torch.Tensor:
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT, free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", MEGATRON_LOGITS, str(model_dir), ",".join(map(str, ids)), str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_megatron_gpt_model_logits_equal_the_hf_models(family, tmp_path):
    """The converted checkpoint in megatron-core's GPTModel (rotary base, GQA, qkv bias, SwiGLU, untied head)
    scores a sequence like transformers does, within 1e-4 (Qwen3: tests/test_train_megatron.py)."""
    pytest.importorskip("megatron.core")
    model = hf_model(family)
    model.save_pretrained(tmp_path / "hf")
    ids = torch.randint(0, VOCAB, (1, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits[0, :-1].float()
    got = megatron_logits(tmp_path / "hf", ids[0].tolist(), tmp_path / "logits.pt")
    assert got.shape == want.shape == (32, VOCAB)
    assert want.std() > 0.3  # sharp enough that a wrong rotary base or head grouping moves logits by far more
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
