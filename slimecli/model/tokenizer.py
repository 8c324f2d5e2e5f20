"""The tiny model's tokenizer: byte-level BPE trained on the package's fixed corpus, saved as an HF fast tokenizer.

Byte-level means every string encodes (no unknown token) and decodes back exactly. The merges are trained
by the `tokenizers` library on `corpus.corpus()` with one thread, so the files are the same on every machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slimecli.model.chat_template import CHAT_TEMPLATE
from slimecli.model.corpus import corpus

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Control tokens: dropped by skip_special_tokens.
CONTROL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Markup tokens: single ids, but kept when decoding with skip_special_tokens (parsers need them).
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
SPECIAL_TOKENS = CONTROL_TOKENS + MARKUP_TOKENS

DEFAULT_VOCAB_SIZE = 4096


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> Any:
    """Train the BPE (vocab_size includes the special tokens, which get the last ids)."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: the merge order cannot depend on scheduling
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def tokenizer_config(tok: Any) -> dict[str, Any]:
    added = {}
    for t in SPECIAL_TOKENS:
        added[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t in CONTROL_TOKENS}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok: Any, out_dir: str | Path) -> dict[str, int]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return the special ids."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")
    special_map = {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START, IM_END]}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
