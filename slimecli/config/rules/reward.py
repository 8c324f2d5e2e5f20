"""Reward rules: the reward exists, its function or server is named, its key names a value (whether the function
is there is a pre-flight check: slimecli/launch/source_checks.py)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.groups.reward import JUDGE_EMBEDDED, RUBRIC_PLACEHOLDERS, VERDICT_KEY, RewardConfig
from slimecli.config.import_path import FORMAT_HINT
from slimecli.config.registry import REWARDS
from slimecli.config.schema import SlimeConfig


def known(cfg: SlimeConfig) -> list[ConfigError]:
    names = sorted(REWARDS.names())
    if cfg.reward.name not in names:
        return [ConfigError("reward.name", cfg.reward.name, "unknown reward", allowed_hint(cfg.reward.name, names))]
    return []


def function(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.reward
    if r.path is None:
        if r.name == "python":
            return [ConfigError("reward.path", None, "reward=python needs reward.path", FORMAT_HINT)]
        if r.group:
            return [ConfigError("reward.group", True, "reward.group=true applies to a python function",
                                "set reward.path=... (reward=python) or drop reward.group")]
    return []


def server(cfg: SlimeConfig) -> list[ConfigError]:
    url = cfg.reward.url
    if cfg.reward.name == "remote" and not url:
        return [ConfigError("reward.url", url, "reward=remote needs the URL of the reward server",
                            "e.g. reward.url=http://127.0.0.1:8000/reward")]
    if url is not None:
        parsed = urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            return [ConfigError("reward.url", url, "must be an http:// or https:// URL with a host")]
    return []


def key(cfg: SlimeConfig) -> list[ConfigError]:
    r = cfg.reward
    errors = []
    if r.key is not None and not str(r.key).strip():
        errors.append(ConfigError("reward.key", r.key, "must be a non-empty key name (or null for numeric rewards)"))
    return errors


def judge(cfg: SlimeConfig) -> list[ConfigError]:
    """reward=judge: where the judge is, and a rubric and verdict form that can work."""
    r = cfg.reward
    if r.name != "judge":
        return []
    errors = []
    url = r.judge_url
    if not url:
        errors.append(ConfigError("reward.judge_url", url, "reward=judge needs the judge's URL",
                                  "an SGLang server (http://host:30000), an OpenAI-compatible base URL "
                                  f"(https://host/v1), or {JUDGE_EMBEDDED} (the run starts one)"))
    elif url == JUDGE_EMBEDDED:
        if r.judge_api in ("openai", "teacher"):
            errors.append(ConfigError("reward.judge_api", r.judge_api, "the embedded judge serves SGLang's "
                                      f"/generate, not the {'OpenAI' if r.judge_api == 'openai' else 'teacher'} API", "set reward.judge_api=auto or generate"))
    else:
        parsed = urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            errors.append(ConfigError("reward.judge_url", url, f"must be an http:// or https:// URL with a host, "
                                      f"or {JUDGE_EMBEDDED}"))
    if r.rubric is not None and "{response}" not in r.rubric:
        others = ", ".join(p for p in RUBRIC_PLACEHOLDERS if p != "{response}")
        errors.append(ConfigError("reward.rubric", _short(r.rubric), "must contain {response} (where the graded "
                                  "answer goes)", f"it may also use {others}"))
    if url == JUDGE_EMBEDDED and cfg.cluster.nnodes > 1 and r.judge_port == "auto":
        errors.append(ConfigError("reward.judge_port", "auto", "a multi-node run's embedded judge needs a port "
                                  "every node agrees on", "set reward.judge_port to a free port of node 0"))
    errors += _teacher_judge(r)
    form = _verdict_form(r)
    return errors + (form or _grammar(r))


def _teacher_judge(r: RewardConfig) -> list[ConfigError]:
    """judge_api=teacher picks among fixed verdicts by their log-probs: PASS/FAIL or the whole scores 0..score_max."""
    if r.judge_api != "teacher":
        return []
    errors = []
    for key in ("verdict_regex", "verdict_schema"):
        if getattr(r, key) is not None:
            errors.append(ConfigError(f"reward.{key}", getattr(r, key), "the teacher judge picks the likeliest of "
                                      "PASS/FAIL or the scores 0..reward.score_max: it has no free-form verdict",
                                      f"drop reward.{key}, or use a judge that generates (reward.judge_api=generate)"))
    if r.verdict == "score" and (r.score_max != int(r.score_max) or r.score_max > 100):
        errors.append(ConfigError("reward.score_max", r.score_max, "with the teacher judge, a whole number up to "
                                  "100 (each score is one scoring request)"))
    return errors


def _grammar(r: RewardConfig) -> list[ConfigError]:
    """With reward.judge_grammar the verdict's form goes to the judge as a constraint: it must be one that
    structured outputs (llguidance, the embedded engine's and SGLang's) compile, which Python's re may not."""
    if not r.judge_grammar:
        return []
    import llguidance

    field, text = ("reward.verdict_schema", r.verdict_schema) if r.verdict_schema is not None else \
        ("reward.verdict_regex", r.verdict_regex)
    if text is None:
        return []
    try:
        grammar = (llguidance.LLMatcher.grammar_from_json_schema(text) if r.verdict_schema is not None
                   else llguidance.LLMatcher.grammar_from_regex(text))
        problem = llguidance.LLMatcher.validate_grammar(grammar, None)
    except ValueError as exc:
        problem = str(exc)
    if problem:
        return [ConfigError(field, _short(text), f"not a constraint structured outputs compile: "
                            f"{' '.join(problem.split())[:200]}", "simplify it, or set reward.judge_grammar=false "
                            "(the reply is then only parsed)")]
    return []


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _verdict_form(r: RewardConfig) -> list[ConfigError]:
    if r.verdict_regex is not None and r.verdict_schema is not None:
        return [ConfigError("reward.verdict_schema", _short(r.verdict_schema), "give reward.verdict_regex or "
                            "reward.verdict_schema, not both", "unset one of them (null)")]
    if r.verdict_regex is not None:
        try:
            compiled = re.compile(r.verdict_regex)
        except re.error as exc:
            return [ConfigError("reward.verdict_regex", r.verdict_regex, f"not a regular expression: {exc}")]
        if compiled.fullmatch("") is not None:
            return [ConfigError("reward.verdict_regex", r.verdict_regex, "matches the empty text, so a reply "
                                "without a verdict would pass", "e.g. (PASS|FAIL)")]
    if r.verdict_schema is not None:
        try:
            schema = json.loads(r.verdict_schema)
        except ValueError as exc:
            return [ConfigError("reward.verdict_schema", _short(r.verdict_schema), f"not JSON: {exc}")]
        props = schema.get("properties") if isinstance(schema, dict) else None
        required = schema.get("required") if isinstance(schema, dict) else None
        if not isinstance(props, dict) or VERDICT_KEY not in props:
            return [ConfigError("reward.verdict_schema", _short(r.verdict_schema), "must be an object schema with "
                                f"a {VERDICT_KEY!r} property (the verdict)")]
        if not isinstance(required, list) or VERDICT_KEY not in required:
            return [ConfigError("reward.verdict_schema", _short(r.verdict_schema), f"must list {VERDICT_KEY!r} in "
                                "\"required\"")]
    return []


RULES = [known, function, server, key, judge]
