"""The quickstart task: a tiny random model learns, by RL alone, to answer with the letter it is asked for.

The reward is dense partial credit (the fraction of the response's characters that are the
asked-for letter), so a random model already earns a little and GRPO has signal from step one.
"""

from __future__ import annotations

import random
from typing import Any

LETTERS = "aeiou"
TEMPLATES = (
    "Write the letter {x} and nothing else.",
    "Answer with the letter {x} only.",
    "Say {x}.",
)


def make_prompt(seed: int, index: int) -> dict[str, Any]:
    """Prompt number `index` of the task: a pure function of (seed, index), so resumes see the same data."""
    rng = random.Random(seed * 1_000_003 + index)
    letter = rng.choice(LETTERS)
    return {"prompt": rng.choice(TEMPLATES).format(x=letter), "label": letter, "metadata": {"task": "quickstart"}}


def letter_reward(response: str, label: str) -> float:
    """Fraction of the response's non-space characters that are the target letter (0 for an empty answer)."""
    chars = [c for c in response if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c == label for c in chars) / len(chars)


def quickstart_reward(sample: Any) -> float:
    return letter_reward(sample.response, str(sample.label))
