"""Packing samples for the policy forward: response positions, masks and log-probs line up."""

from __future__ import annotations

import torch

from slimecli.rollout.sample import Sample
from slimecli.train.batch import pack


def test_pack_aligns_response_tokens_with_the_logits_that_predict_them():
    a = Sample(tokens=[5, 6, 7, 8, 9], response_length=2, loss_mask=[1, 0], rollout_log_probs=[-0.5, 0.0])
    b = Sample(tokens=[1, 2, 3], response_length=1, rollout_log_probs=[-1.5])
    p = pack([a, b], pad_id=0)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]
    assert p.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert p.targets.tolist() == [[8, 9], [3, 0]]
    assert p.logit_index[0].tolist() == [2, 3]  # logits at position 2 predict token 3 (=8)
    assert p.logit_index[1, 0].item() == 1
    assert p.mask.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert torch.allclose(p.rollout_log_probs, torch.tensor([[-0.5, 0.0], [-1.5, 0.0]]))


def test_removed_sample_has_zero_mask():
    s = Sample(tokens=[1, 2, 3, 4], response_length=2, remove_sample=True)
    assert pack([s], pad_id=0).mask.tolist() == [[0.0, 0.0]]


def test_per_token_fields_of_the_wrong_length_name_the_sample():
    import pytest

    for bad in (Sample(index=3, tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1]),
                Sample(index=3, tokens=[1, 2, 3, 4], response_length=2, rollout_log_probs=[-1.0, -2.0, -3.0])):
        with pytest.raises(ValueError, match="sample 3: .* one value per response token"):
            pack([Sample(tokens=[1, 2], response_length=1), bad], pad_id=0)
    with pytest.raises(ValueError, match="sample 5: response_length 4 leaves no prompt token"):
        pack([Sample(index=5, tokens=[1, 2, 3, 4], response_length=4)], pad_id=0)


def test_response_logprobs_match_a_direct_forward():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slimecli.train.policy import response_logits

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    samples = [Sample(tokens=[3, 4, 5, 6, 7], response_length=3), Sample(tokens=[9, 8, 7], response_length=1)]
    packed = pack(samples, pad_id=0)
    logits = response_logits(model, packed)
    for i, s in enumerate(samples):
        full = model(torch.tensor([s.tokens])).logits[0]
        start = len(s.tokens) - s.response_length
        expected = torch.log_softmax(full[start - 1:len(s.tokens) - 1], -1)
        got = torch.log_softmax(logits[i, :s.response_length], -1)
        assert torch.allclose(got, expected, atol=1e-5)
