"""Vocab-parallel log-probs and sampling: 2 real ranks over gloo against TP=1 and a full-vocab reference."""

from __future__ import annotations

import json

import pytest
import torch

from slimecli.teacher import vocab_parallel as vp
from tests.helpers import run_ranks


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("vp")
    run_ranks("vocab_parallel_check", 2, str(out), timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_tp2_matches_tp1_and_reference(reports):
    for rep in reports:
        assert rep["tp"] == 2
        for e in rep["exact"]:
            assert e["label_tp_vs_tp1"] < 1e-5 and e["next_tp_vs_tp1"] < 1e-5, e
            assert e["label_vs_ref"] < 1e-5 and e["next_vs_ref"] < 1e-5, e
            assert e["sampled_logp_vs_ref"] < 1e-5, e
            assert 0 <= e["sampled_min_id"] and e["sampled_max_id"] < e["vocab"], e  # padding (logit 80) never drawn
            assert e["all_ranks_same_ids"], e


def test_no_rank_creates_full_vocab_tensors(reports):
    for rep in reports:
        for e in rep["exact"]:
            if e["vocab"] >= 1000:
                assert e["max_numel_created"] < e["local_numel"] < e["full_numel"], e
                assert e["max_last_dim_created"] < e["vocab"], e


def test_sample_frequencies_match_softmax(reports):
    seen = set()
    for rep in reports:
        for f in rep["freq"]:
            seen.add((f["tp"], f["vocab"]))
            assert f["out_of_vocab"] == 0, f
            assert max(f["chi"]) < f["bound"], f
    assert {(1, 7), (2, 7), (1, 11), (2, 11)} <= seen  # 7 and 11 do not divide by 2


def test_single_rank_validation_and_shapes():
    shard = vp.VocabShard(10, 1, 0)
    logits = torch.randn(4, 10)
    with pytest.raises(ValueError, match="label ids"):
        vp.label_log_probs(logits, torch.tensor([[10]] * 4), shard)
    with pytest.raises(ValueError, match="local logits"):
        vp.label_log_probs(torch.randn(4, 9), torch.zeros(4, 1, dtype=torch.long), shard)
    ids, logps = vp.sample(logits, 0, shard)
    assert ids.shape == (4, 0) and logps.shape == (4, 0)
    ids, logps = vp.sample(logits, 3, shard, generator=torch.Generator().manual_seed(0))
    ref = torch.log_softmax(logits, -1).gather(-1, ids)
    assert torch.allclose(logps, ref, atol=1e-6)
    assert vp.VocabShard(7, 2, 1).start == 4 and vp.VocabShard(7, 2, 1).valid == 3
    assert vp.VocabShard(1, 2, 1).valid == 0
