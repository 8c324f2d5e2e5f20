"""Task rules: the dataset or task file exists and every SWE row is well-formed, before anything starts."""

from __future__ import annotations

from pathlib import Path

from slimecli.config.errors import ConfigError, did_you_mean
from slimecli.config.schema import SlimeConfig

MAX_LISTED = 20  # row errors shown in full; the rest are counted


def jsonl(cfg: SlimeConfig) -> list[ConfigError]:
    t = cfg.task
    if t.name != "jsonl":
        return []
    if not t.path:
        return [ConfigError("task.path", None, "task=jsonl needs task.path (a JSONL file of prompts)")]
    if not Path(t.path).expanduser().is_file():
        return [ConfigError("task.path", t.path, "file does not exist")]
    return []


def swe(cfg: SlimeConfig) -> list[ConfigError]:
    from slimecli.swe.builtin import SETS
    from slimecli.swe.task import BUILTIN_PREFIX, TaskFileError, load_for

    t = cfg.task
    if t.name != "swe":
        return []
    if not t.path:
        return [ConfigError("task.path", None, "task=swe needs task.path: a SWE-bench JSONL file or builtin:NAME",
                            f"built-in sets: {', '.join(BUILTIN_PREFIX + s for s in SETS)}")]
    if t.repos_dir and not Path(t.repos_dir).expanduser().is_dir():
        return [ConfigError("task.repos_dir", t.repos_dir, "no such directory",
                            "a directory of the rows' git repositories, named owner__name, owner/name or name")]
    try:
        tasks = load_for(t)
    except TaskFileError as exc:
        return [ConfigError("task.path", t.path, str(exc), "`slimecli tasks list` shows the built-in sets")]
    errors = []
    if tasks.errors and t.on_invalid == "error":
        shown = [ConfigError("task.path", t.path, f"bad task row: {e.render()}") for e in tasks.errors[:MAX_LISTED]]
        more = len(tasks.errors) - len(shown)
        if more:
            shown.append(ConfigError("task.path", t.path, f"... and {more} more bad rows"))
        shown[-1] = ConfigError(shown[-1].path, shown[-1].value, shown[-1].reason,
                                "fix the rows, or task.on_invalid=skip to skip and count them")
        errors += shown
    if not tasks.tasks:
        errors.append(ConfigError("task.path", t.path, "no valid task in the file"))
    elif t.instance is not None and tasks.get(t.instance) is None:
        errors.append(ConfigError("task.instance", t.instance, f"no such instance_id in {t.path}",
                                  did_you_mean(t.instance, tasks.ids) or f"e.g. {tasks.ids[0]}"))
    return errors


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


RULES = [jsonl, swe, graded_by_tests]
