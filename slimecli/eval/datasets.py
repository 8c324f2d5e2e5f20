"""The prompts of an eval dataset, read once, in file order, through the same readers as `task`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimecli.config.groups.eval import EvalDatasetConfig


def load_records(ds: EvalDatasetConfig) -> list[dict[str, Any]]:
    """{prompt, label, metadata} records (SWE ones carry their `task` too); the first max_samples of them."""
    from slimecli.rollout.data import _read_jsonl, _read_swe
    from slimecli.rollout.quickstart import heldout_prompts

    if ds.task == "quickstart":
        rows = heldout_prompts()
    elif ds.task == "jsonl":
        rows = _read_jsonl(Path(ds.path or "").expanduser(), ds.prompt_key, ds.label_key)
    else:
        rows = _read_swe(ds.path or "", "error")
    return rows[: ds.max_samples] if ds.max_samples is not None else rows
