"""One episode's token stream, tokens in and tokens out: the first prompt is rendered with the chat template once;
after that, every turn's sampled tokens are kept exactly as sampled and every observation is rendered on its own
and appended. The history is never re-tokenized, so the trained tokens are the sampled ones and each turn's prompt
extends the last one (the engine's prefix cache computes only the new tokens).

An observation is rendered as what the template adds after a fixed opening conversation: the text of
``render(opening + messages, generation prompt)`` past ``render(opening)``. The opening ends with a user turn, whose
rendering no later message changes (templates that rewrite earlier assistant turns, as Qwen3's does with
reasoning, keep user turns as they are). The sampled turn is closed with what the template writes after an
assistant's content (``<|im_end|>\\n``), less the stop token the model already sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_SENTINEL = "\u2063slimecli-turn-end\u2063"  # a content no real message has
_OPENING = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


class TemplateError(ValueError):
    """The chat template cannot render an observation as a continuation (it rewrites earlier turns)."""


def _text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
          generation_prompt: bool) -> str:
    out = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation_prompt,
                                        tokenize=False)
    return str(out)


def _ids(out: Any) -> list[int]:
    if isinstance(out, dict) or hasattr(out, "keys"):  # BatchEncoding from newer transformers
        out = out["input_ids"]
    return [int(i) for i in out]


@dataclass
class Conversation:
    """The episode's tokens so far; `mask` and `log_probs` have one entry per token after the first prompt."""

    tokenizer: Any
    stop_ids: frozenset[int]
    tools: list[dict[str, Any]] | None = None
    tokens: list[int] = field(default_factory=list)
    prompt_len: int = 0
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    _closing: str | None = None

    def open(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        self.tools = tools
        self.tokens = _ids(self.tokenizer.apply_chat_template(messages, tools=tools or None,
                                                              add_generation_prompt=True, tokenize=True))
        self.prompt_len = len(self.tokens)

    @property
    def added(self) -> int:
        """Tokens after the first prompt: the episode's budget counts these."""
        return len(self.tokens) - self.prompt_len

    def sampled(self, ids: list[int], log_probs: list[float], mask: list[int] | None = None) -> None:
        self.tokens.extend(ids)
        self.mask.extend(mask if mask is not None else [1] * len(ids))
        self.log_probs.extend(log_probs)

    def observe(self, messages: list[dict[str, Any]], last_turn: list[int]) -> int:
        """Close the policy's turn and append the observation (and the next generation prompt) as context;
        returns how many tokens were added."""
        closing = self._closing_text()
        stop = self.tokenizer.decode([last_turn[-1]]) if last_turn and last_turn[-1] in self.stop_ids else ""
        text = closing[len(stop):] if stop and closing.startswith(stop) else closing
        if messages:
            opening = _text(self.tokenizer, _OPENING, self.tools, False)
            after = _text(self.tokenizer, _OPENING + messages, self.tools, True)
            if not after.startswith(opening):
                raise TemplateError("the chat template renders the opening turns differently once more messages "
                                    "follow: observations cannot be appended token by token")
            text += after[len(opening):]
        ids = _ids(self.tokenizer(text, add_special_tokens=False)) if text else []
        self.tokens.extend(ids)
        self.mask.extend([0] * len(ids))
        self.log_probs.extend([0.0] * len(ids))
        return len(ids)

    def _closing_text(self) -> str:
        if self._closing is None:
            rendered = _text(self.tokenizer, [*_OPENING, {"role": "assistant", "content": _SENTINEL}], self.tools,
                             False)
            at = rendered.rfind(_SENTINEL)
            self._closing = rendered[at + len(_SENTINEL):] if at >= 0 else ""
        return self._closing
