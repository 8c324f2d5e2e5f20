from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec
from slimecli.config.port import Port, port_field

# The judge's prompt when reward.rubric is not set: {prompt}, {response} and {label} are filled in.
DEFAULT_RUBRIC = (
    "You grade an answer to a task.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n{label}\n\n"
    "Answer to grade:\n{response}\n\n{instruction}"
)
RUBRIC_PLACEHOLDERS = ("{prompt}", "{response}", "{label}", "{instruction}")
# The verdict's form when reward.verdict_regex and verdict_schema are unset; its group 1 is the verdict.
DEFAULT_VERDICT_REGEX = {"pass_fail": r"(PASS|FAIL)", "score": r"([0-9]{1,3}(\.[0-9]{1,2})?)"}
VERDICT_KEY = "verdict"  # the property of a JSON verdict (reward.verdict_schema) that holds it
JUDGE_EMBEDDED = "embedded"  # reward.judge_url: the run starts an embedded engine as its judge


@dataclass(frozen=True)
class RewardConfig:
    """Reward function selection and how rewards become training values."""

    name: str = "exact_match"  # exact_match | math | f1 | remote | judge | python | quickstart | swe_tests
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
    # reward=judge (slimecli/reward/judge.py): a served model grades each sample
    # judge_url: an SGLang-native server (its /generate), an OpenAI-compatible base URL ending in /v1, or
    # "embedded": an embedded engine the run starts itself, serving judge_model (default: the run's model)
    judge_url: str | None = None
    # auto: openai when the URL's path has /v1, else generate; teacher: slimecli's teacher server, whose log-probs
    # pick the likeliest verdict (PASS/FAIL, or a whole score 0..score_max)
    judge_api: Literal["auto", "generate", "openai", "teacher"] = "auto"
    judge_model: str | None = None  # openai: the "model" field; embedded: the checkpoint it serves
    judge_api_key: str | None = None  # Bearer token; else $SLIMECLI_JUDGE_API_KEY
    judge_host: str = spec("127.0.0.1", resumable=True)  # judge_url=embedded: where it listens
    judge_port: Port = port_field()  # judge_url=embedded: auto picks a free port at launch
    rubric: str | None = None  # the judge's prompt: {prompt} {response} {label} {instruction}; None: DEFAULT_RUBRIC
    verdict: Literal["score", "pass_fail"] = "pass_fail"  # pass_fail: 1.0 / 0.0; score: number / score_max
    verdict_regex: str | None = None  # the verdict's form (its group "verdict", or 1, is read); None: per verdict
    verdict_schema: str | None = None  # a JSON schema (its JSON text) with a "verdict" property, instead of a regex
    score_max: float = spec(10.0, gt=0)  # verdict=score: the top of the scale (reward = score / score_max)
    judge_grammar: bool = True  # send the regex or schema as a structured-output constraint
    judge_max_tokens: int = spec(256, gt=0)  # the verdict's token budget
    judge_temperature: float = spec(0.0, ge=0)
    judge_cache_size: int = spec(65536, ge=0, note="0 = no cache")  # verdicts kept by (prompt, response, rubric)
    judge_start_timeout_s: float = spec(600.0, gt=0, resumable=True)  # judge_url=embedded: load and warm-up
