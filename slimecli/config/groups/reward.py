from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec


@dataclass(frozen=True)
class RewardConfig:
    """Reward function selection and how rewards become training values."""

    name: str = "exact_match"  # exact_match | math | f1 | remote | python | quickstart | swe_tests
    key: str | None = None  # picks the value out of a dict reward
    path: str | None = None  # reward=python: package.module:function or /file.py:function
    group: bool = False  # the python function scores a whole group at once
    url: str | None = None  # reward=remote
    timeout_s: float = spec(60.0, gt=0, resumable=True)  # per reward call (per HTTP request for reward=remote)
    max_retries: int = spec(3, ge=0)  # reward=remote: retries after the first attempt
    backoff_s: float = spec(0.5, ge=0)  # reward=remote: first retry delay, doubled each retry, with jitter
    concurrency: int = spec(32, gt=0)  # reward calls (HTTP requests) in flight at once
    on_invalid: Literal["zero", "drop_group", "error"] = "zero"
    partial: bool = False  # swe_tests: the FAIL_TO_PASS fraction when every PASS_TO_PASS test passes (else 0)
