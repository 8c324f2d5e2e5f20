"""Eval rules: when evaluation runs, and every dataset's source and reward, before anything starts.

A dataset's values are checked after its overrides are applied to the run's settings, with the same rules
as `task`, `rollout` and `reward`; their messages name the dataset's key (eval.datasets[1].temperature).
"""

from __future__ import annotations

import re
from dataclasses import replace

from slimecli.config.errors import ConfigError
from slimecli.config.eval_settings import dataset_reward, dataset_task
from slimecli.config.groups.eval import EvalDatasetConfig
from slimecli.config.schema import SlimeConfig

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a metric segment and a file name


def schedule(cfg: SlimeConfig) -> list[ConfigError]:
    e = cfg.eval
    errors = []
    if (e.interval > 0 or e.at_start or e.at_end) and not e.datasets:
        errors.append(ConfigError("eval.datasets", [], "evaluation is on but there is nothing to evaluate",
                                  "add eval.datasets=[{name: heldout, task: jsonl, path: FILE}], or set "
                                  "eval.interval=0 eval.at_start=false eval.at_end=false"))
    return errors


def names(cfg: SlimeConfig) -> list[ConfigError]:
    errors = []
    seen: set[str] = set()
    for i, ds in enumerate(cfg.eval.datasets):
        if not NAME.match(ds.name):
            errors.append(ConfigError(f"eval.datasets[{i}].name", ds.name,
                                      "needs a name of letters, digits, '_', '-' or '.' (metrics are eval/<name>/...)"))
        elif ds.name in seen:
            errors.append(ConfigError(f"eval.datasets[{i}].name", ds.name, "two datasets have this name"))
        seen.add(ds.name)
    return errors


def _source(cfg: SlimeConfig, ds: EvalDatasetConfig, where: str) -> list[ConfigError]:
    from slimecli.config.rules import task as task_rules

    if ds.task == "quickstart":
        return []
    found = task_rules.path_given(replace(cfg, task=dataset_task(ds, cfg.task)))  # the file: launch/source_checks
    errors = [replace(e, path=f"{where}.path" if e.path == "task.path" else e.path, hint=e.hint.replace(
        "task.path", f"{where}.path").replace("task=jsonl", f"{where}.task=jsonl").replace("task=swe", f"{where}.task=swe"))
        for e in found]
    if ds.task == "swe" and cfg.agent.name == "none" and not cfg.agent.harness:
        errors.append(ConfigError(f"{where}.task", "swe", "SWE tasks are evaluated by an agent working them",
                                  "add agent=claude_code or agent=codex"))
    return errors


def _reward(cfg: SlimeConfig, ds: EvalDatasetConfig, where: str) -> list[ConfigError]:
    from slimecli.config.rules import reward as reward_rules

    reward = dataset_reward(ds, cfg.reward)
    if reward == cfg.reward:  # the run's own reward: its rules report it
        return []
    scoped = replace(cfg, reward=reward)
    errors = [e for rule in reward_rules.RULES for e in rule(scoped)]
    return [replace(e, path=f"{where}.{e.path}" if e.path.startswith("reward.") else e.path,
                    hint=e.hint.replace("reward.", f"{where}.reward.").replace("reward=python", f"{where}.reward.name=python"))
            for e in errors]


def datasets(cfg: SlimeConfig) -> list[ConfigError]:
    errors = []
    for i, ds in enumerate(cfg.eval.datasets):
        where = f"eval.datasets[{i}]"
        errors += _source(cfg, ds, where) + _reward(cfg, ds, where)
    return errors


RULES = [schedule, names, datasets]
