"""Task rules: a task that reads a file names one, and SWE tasks are graded by their tests."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig


def path_given(cfg: SlimeConfig) -> list[ConfigError]:
    """task=jsonl and task=swe need task.path (the file itself is read in pre-flight: launch/source_checks.py)."""
    t = cfg.task
    if t.name == "jsonl" and not t.path:
        return [ConfigError("task.path", None, "task=jsonl needs task.path (a JSONL file of prompts)")]
    if t.name == "swe" and not t.path:
        return [ConfigError("task.path", None, "task=swe needs task.path: a SWE-bench JSONL file or builtin:NAME",
                            "`slimecli tasks list` shows the built-in sets (builtin:NAME)")]
    return []


def graded_by_tests(cfg: SlimeConfig) -> list[ConfigError]:
    if cfg.task.name == "swe" and cfg.reward.name != "swe_tests":
        return [ConfigError("reward.name", cfg.reward.name, "SWE tasks are graded by their tests",
                            "use reward=swe_tests (task=swe picks it when no reward is given)")]
    if cfg.reward.name == "swe_tests" and cfg.task.name != "swe":
        return [ConfigError("reward.name", "swe_tests", "reward=swe_tests grades SWE tasks", "add task=swe")]
    if cfg.reward.partial and cfg.reward.name != "swe_tests":
        return [ConfigError("reward.partial", True, "applies to reward=swe_tests only")]
    if cfg.reward.partial and cfg.reward.key == "resolved":
        return [ConfigError("reward.key", "resolved", "with reward.partial=true the partial score is the 'reward' "
                            "entry of the grade; 'resolved' stays binary", "add reward.key=reward")]
    return []


RULES = [path_given, graded_by_tests]
