"""The transcript of one `slimecli agent run`: what the model wrote, turn after turn, with the tool results it
saw, and the CLI's own output; a file next to the samples, so the console shows progress, not pages of text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slimecli.rollout.sample import Sample

TRANSCRIPT_FILE = "transcript.md"


def render(samples: Sequence[Sample]) -> str:
    """Markdown: the prompt, each branch's response (model and tool turns), the CLI's stdout and stderr."""
    if not samples:
        return "(no samples)\n"
    meta = samples[0].metadata
    prompt = samples[0].prompt
    parts = [f"# Prompt\n\n{prompt if isinstance(prompt, str) else repr(prompt)}\n"]
    for i, sample in enumerate(samples, start=1):
        title = "Model and tool turns" if len(samples) == 1 else f"Branch {i} of {len(samples)}: model and tool turns"
        parts.append(f"# {title} ({sample.metadata.get('turns', '?')} turns, {sample.response_length} tokens, "
                     f"{sample.status.value})\n\n{sample.response or '(nothing)'}\n")
    for stream in ("stdout", "stderr"):
        text = str(meta.get(f"cli_{stream}") or "").rstrip("\n")
        if text:
            parts.append(f"# The CLI's {stream} (its last part)\n\n{text}\n")
    if meta.get("error"):
        parts.append(f"# Error\n\n{meta['error']}\n")
    return "\n".join(parts)


def write(directory: Path, samples: Sequence[Sample]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TRANSCRIPT_FILE
    path.write_text(render(samples), encoding="utf-8")
    return path
