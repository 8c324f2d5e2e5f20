"""Does a running teacher share the student's vocabulary? A teacher that slimecli launches is checked from its
files before anything starts (launch/preflight.py); one that runs already (a `url`) is asked when the trainer
starts, and a mismatch refuses the run: log-probs of other token ids would train the student on noise.

teacher=server: its /info vocab_size against the student's, then the tokenizers themselves where the teacher's
model_path is a directory here. teacher=sglang: its tokenizer directory (/get_model_info) where it is here,
else the ids its tokenizer gives a probe text against the student's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slimecli.model.loading import PROBE_TEXT, check_tokenizers_compatible
from slimecli.teacher.client import TeacherClient


def model_vocab_size(model_path: str | Path) -> int | None:
    """The output vocabulary of a Hugging Face checkpoint (config.json's vocab_size), None where it says none."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) else None


async def vocabulary_problem(client: TeacherClient, student_path: str, student_tokenizer_path: str,
                             student_tokenizer: Any) -> str | None:
    """None when the teacher at ``client.url`` scores the student's token ids; else why it cannot."""
    info = await client.info()
    if client.kind == "server":
        theirs, ours = info.get("vocab_size"), model_vocab_size(student_path)
        if isinstance(theirs, int) and ours is not None and theirs != ours:
            return (f"its model's vocabulary has {theirs} tokens, the student's ({student_path}) {ours}: "
                    "it would score other token ids")
        local = info.get("model_path")
    else:
        local = info.get("tokenizer_path") or info.get("model_path")
    if isinstance(local, str) and Path(local).is_dir():
        problem = check_tokenizers_compatible(student_tokenizer_path, local)
        return f"{problem} (the teacher's files as its server reports them)" if problem else None
    if client.kind == "server":
        return None  # its vocabulary size agrees, and its files are on another machine
    ours_ids = [int(i) for i in student_tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]
    theirs_ids = await client.encode(PROBE_TEXT)
    if theirs_ids[len(theirs_ids) - len(ours_ids):] != ours_ids:  # the teacher's may start with a BOS token
        return (f"its tokenizer encodes a probe text to other ids than the student's ({student_tokenizer_path}): "
                f"{theirs_ids[:12]}... vs {ours_ids[:12]}...")
    return None
