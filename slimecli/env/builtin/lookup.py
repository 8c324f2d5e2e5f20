"""env=native env.id=lookup: the policy must call a tool to find something out, then answer.

Each task hides a secret word. The `lookup` tool reveals it; the episode ends when the policy answers, with the
`answer` tool or in plain text. The reward is 1 for the secret word once looked up, else 0: an answer that was not
looked up is a guess, however lucky, so the only way to reward is to use the tool and then repeat what it said.
It is small enough that the tiny model learns it on a CPU in minutes (recipe env_lookup, with
env.constrain=tool_calls). The tool says the word `repeat` times (16): a randomly initialised model attends almost
evenly over its context, and one copy of the word among hundreds of tokens is too faint a signal to learn to
repeat it within minutes; sixteen copies are not (runs with one copy stayed at chance for 100 steps).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from slimecli.env.protocol import Action, Observation, StepResult, tool_result

WORDS = ("blue", "fish", "king", "moon", "pink", "snow")  # two tokens each in the tiny tokenizer, first ones distinct
REPEAT = 16
SYSTEM = "Find the secret word with the lookup tool, then give it with the answer tool."


class LookupEnv:
    def __init__(self, words: list[str] | tuple[str, ...] = WORDS, num_tasks: int = 600, seed: int = 0,
                 repeat: int = REPEAT) -> None:
        if len(words) < 2 or not all(isinstance(w, str) and w for w in words):
            raise TypeError("words must be at least two non-empty strings")
        self.words = tuple(words)
        self.num_tasks = int(num_tasks)
        self.seed = int(seed)
        self.repeat = int(repeat)
        self.secret = ""
        self.looked = False

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        """num_tasks rows, each a secret word; the eval split draws from another seed."""
        rng = random.Random(f"{self.seed}:{split}")
        secrets: list[str] = []
        while len(secrets) < self.num_tasks:  # every word once in each run of len(words) tasks, in a random order
            block = list(self.words)
            rng.shuffle(block)
            secrets += block
        return [{"id": f"{split}-{i}", "secret": secret} for i, secret in enumerate(secrets[:self.num_tasks])]

    def tools(self) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {"name": "lookup", "description": "Reveal the secret word.",
                                              "parameters": {"type": "object", "properties": {},
                                                             "additionalProperties": False}}},
            {"type": "function", "function": {
                "name": "answer", "description": "Give the secret word; this ends the episode.",
                "parameters": {"type": "object", "properties": {"word": {"type": "string", "enum": list(self.words)}},
                               "required": ["word"], "additionalProperties": False}}},
        ]

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        secret = task.get("secret")
        if secret not in self.words:
            raise ValueError(f"task {task.get('id')!r}: secret must be one of {list(self.words)}, got {secret!r}")
        self.secret, self.looked = str(secret), False
        return Observation([{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "What is the secret word?"}], self.tools())

    async def step(self, action: Action) -> StepResult:
        results = []
        for call in action.tool_calls:
            if call.name == "lookup":
                self.looked = True
                results.append(tool_result(call, "\n".join([self.secret] * self.repeat)))
            elif call.name == "answer":
                return self._answer(str(call.arguments.get("word", "")))
        if not action.tool_calls:
            return self._answer(action.content)
        # once it has looked, answering is all that is left to do: the answer tool alone is offered
        return StepResult(Observation(results, [t for t in self.tools() if t["function"]["name"] == "answer"]))

    def _answer(self, word: str) -> StepResult:
        correct = word.strip().lower() == self.secret
        return StepResult(reward=1.0 if correct and self.looked else 0.0, done=True, info={"looked": self.looked, "correct": correct})

    async def close(self) -> None:
        pass
