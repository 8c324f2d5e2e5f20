"""Which megatron-core layer spec trainer=megatron builds: Transformer Engine's where it can run, else the local
spec with a warning. Only a GPU with Transformer Engine installed builds the TE spec (docs/gpu.md); here the
choice, the names its fused norms carry and the CPU outcome are checked."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from slimecli.model.megatron.build import _global_name, spec_choice


@pytest.mark.parametrize(("te", "gpu", "kind", "says"), [
    (True, True, "transformer_engine", None),
    (False, True, "local", "Transformer Engine is not installed"),
    (True, False, "local", "no GPU"),
    (False, False, "local", "no GPU"),
])
def test_transformer_engine_only_with_a_gpu_and_te(te, gpu, kind, says):
    chosen, warning = spec_choice(te, gpu)
    assert chosen == kind
    assert (warning is None) if says is None else (says in warning)


def test_te_fused_norm_weights_load_and_export_under_the_local_names():
    assert _global_name("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", 2) == \
        "decoder.layers.2.input_layernorm.weight"
    assert _global_name("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", 0) == \
        "decoder.layers.1.pre_mlp_layernorm.weight"
    for same in ("decoder.layers.0.self_attention.linear_qkv.weight", "decoder.final_layernorm.weight",
                 "decoder.layers.0.self_attention.q_layernorm.weight", "embedding.word_embeddings.weight"):
        assert _global_name(same, 0) == same


@pytest.mark.slow  # imports megatron-core (seconds)
def test_this_machine_builds_the_local_spec_and_says_why(caplog):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.spec_utils import ModuleSpec

    from slimecli.model.megatron.build import layer_specs

    with caplog.at_level(logging.WARNING, logger="slimecli.megatron"):
        spec = layer_specs(SimpleNamespace(qk_norm=True), SimpleNamespace(sequence_parallel=False))
    assert isinstance(spec, ModuleSpec)
    assert "linear_qkv" in repr(spec.submodules.self_attention.submodules)
    assert "TE" not in repr(spec.submodules.self_attention.submodules.linear_qkv)
    assert any("local spec" in r.getMessage() for r in caplog.records)
