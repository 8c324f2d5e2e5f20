from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TaskConfig:
    """Where prompts come from: the built-in quickstart task, a JSONL dataset, or a single agent task."""

    name: Literal["quickstart", "jsonl", "swe"] = "quickstart"
    path: str | None = None  # jsonl dataset
    prompt_key: str = "prompt"
    label_key: str = "label"
    prompt: str | None = None  # a single agent task (slimecli agent run)
    workdir: str | None = None
    apply_chat_template: bool = True
    shuffle: bool = True
