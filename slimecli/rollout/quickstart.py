"""The quickstart task: a tiny random model learns, by RL alone, to answer in CAPITAL letters.

The reward is dense partial credit (the fraction of the response's letters that are upper
case), so a random model already earns a little and GRPO has signal from the first step,
while the best answers need the policy to move nearly all its mass onto upper-case tokens.
"""

from __future__ import annotations

import random
from typing import Any

TEMPLATES = (
    "Reply in CAPITAL letters: {x}",
    "Shout it back: {x}",
    "Answer only in upper case. {x}",
    "Say it loudly! {x}",
)
WORDS = ("hello there", "good morning", "where is the cat", "we won", "look out", "it works", "run the tests",
         "ship it", "stop the build", "all green")


def make_prompt(seed: int, index: int) -> dict[str, Any]:
    """Prompt number `index`: a pure function of (seed, index), so a resumed run sees the same data."""
    rng = random.Random(seed * 1_000_003 + index)
    words = rng.choice(WORDS)
    return {"prompt": rng.choice(TEMPLATES).format(x=words), "label": words.upper(),
            "metadata": {"task": "quickstart"}}


def uppercase_reward(response: str) -> float:
    """Fraction of the response's letters that are upper case; 0 for a response without letters."""
    letters = [c for c in response if c.isalpha()]
    if not letters:
        return 0.0
    return sum(c.isupper() for c in letters) / len(letters)


def quickstart_reward(sample: Any) -> float:
    return uppercase_reward(str(sample.response))
