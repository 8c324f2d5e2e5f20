"""Chat messages + tools -> prompt token ids with the model's own chat template, and output ids -> text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Renderer:
    """Wraps the HF tokenizer of the policy model; knows its context window and stop tokens."""

    def __init__(self, tokenizer: Any, context_len: int) -> None:
        self.tokenizer = tokenizer
        self.context_len = context_len
        eos = tokenizer.eos_token_id
        self.stop_ids: set[int] = {eos} if eos is not None else set()
        for tok in ("<|im_end|>", "<|endoftext|>"):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
                self.stop_ids.add(tid)
        # Added tokens are single tokens to a grammar engine too: a constrained turn names them by id, so it
        # samples the same ids the chat template renders (see slimecli.model.tool_grammar).
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self.added_tokens: dict[str, int] = {str(k): int(v) for k, v in added.items()}

    @classmethod
    def from_path(cls, path: str | Path, context_len: int | None = None) -> Renderer:
        from slimecli.model.loading import load_tokenizer  # honours model.trust_remote_code (set_trust_remote_code)

        tok = load_tokenizer(path)
        if context_len is None:
            context_len = _model_context(Path(path)) or min(int(tok.model_max_length), 1 << 20)
        return cls(tok, context_len)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding from newer transformers
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        """Output text with markup kept and the final stop token removed."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def decode_all(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _model_context(path: Path) -> int | None:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("max_sequence_length")
    return int(value) if value else None


def tool_schema(name: str, description: str, parameters: Any) -> dict[str, Any]:
    """The OpenAI function shape that Qwen-style templates render."""
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": parameters}}
