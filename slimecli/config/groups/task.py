from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TaskConfig:
    """Where prompts come from: the built-in quickstart task, a JSONL dataset, SWE tasks, or one agent prompt."""

    name: Literal["quickstart", "jsonl", "swe"] = "quickstart"
    path: str | None = None  # jsonl: a dataset file; swe: a task file (SWE-bench JSONL) or builtin:NAME
    prompt_key: str = "prompt"
    label_key: str = "label"
    prompt: str | None = None  # a single agent task (slimecli agent run)
    workdir: str | None = None
    instance: str | None = None  # swe: the instance_id one command works on (agent run, tasks grade)
    on_invalid: Literal["error", "skip"] = "error"  # swe: a malformed row stops the run, or is skipped and counted
    # swe: where each task's agent and tests run (slimecli.swe.env): host = slimecli's interpreter (or a cached
    # runner venv when it lacks pytest); venv = a cached venv of the repository's dependencies; image = the row's
    # image in sandbox=podman|docker; auto = image if the row names one and the sandbox is a container, else venv
    # if the repository declares dependencies, else host
    environment: Literal["auto", "host", "venv", "image"] = "auto"
    env_installer: Literal["pip", "uv"] = "pip"  # swe: what installs a venv's packages
    env_dir: str | None = None  # swe: the environment cache; None -> ~/.cache/slimecli/envs ($SLIMECLI_CACHE/envs)
    # swe: the layout of task.path's rows (slimecli.swe.formats): auto detects it per row from its fields
    format: Literal["auto", "slimecli", "swebench", "swegym", "swesmith", "r2egym"] = "auto"
    repos_dir: str | None = None  # swe: local mirrors of the rows' repositories (owner__name, owner/name or name)
    apply_chat_template: bool = True
    shuffle: bool = True
