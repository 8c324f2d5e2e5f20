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


# The held-out evaluation set: templates and phrases the training prompts never use.
HELDOUT_TEMPLATES = (
    "Write this in capitals: {x}",
    "Repeat it in upper case: {x}",
)
HELDOUT_WORDS = ("see you soon", "the build is red", "merge the branch", "coffee time", "deploy on friday",
                 "read the logs", "nice work", "try again later")


def heldout_prompts() -> list[dict[str, Any]]:
    """The quickstart's held-out prompts (eval task=quickstart), in a fixed order."""
    return [{"prompt": t.format(x=w), "label": w.upper(), "metadata": {"task": "quickstart", "heldout": True}}
            for w in HELDOUT_WORDS for t in HELDOUT_TEMPLATES]


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
