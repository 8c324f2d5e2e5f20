"""Eval rules: when evaluation runs, and every dataset's source and reward, before anything starts.

A dataset's values are checked after its overrides are applied to the run's settings, with the same rules
as `task`, `rollout` and `reward`; their messages name the dataset's key (eval.datasets[1].temperature). An
environment dataset (`env`) names its environment like env=... does, and its reward is the episodes'.
"""

from __future__ import annotations

import re
from dataclasses import replace

from slimecli.config.errors import ConfigError
from slimecli.config.eval_settings import dataset_reward, dataset_task
from slimecli.config.groups.eval import EvalDatasetConfig, EvalRewardConfig
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


def _environment(ds: EvalDatasetConfig, where: str) -> list[ConfigError]:
    """An environment dataset: the environment it loads (whether it loads: launch/source_checks); its reward is
    its episodes', so a reward override, stop strings or SWE tasks are refused with the reason."""
    from slimecli.config.rules.env import _native_id

    if ds.env is None:
        if ds.id is not None or ds.args:
            key, value = (f"{where}.id", ds.id) if ds.id is not None else (f"{where}.args", ds.args)
            return [ConfigError(key, value, "applies to an environment dataset",
                                f"pick one: {where}.env=native|verifiers|openenv|skyrl_gym|reasoning_gym")]
        return []
    errors = []
    if not ds.id:
        errors.append(ConfigError(f"{where}.id", ds.id, f"{where}.env={ds.env} needs the environment to load",
                                  "slimecli env list shows what is installed"))
    elif ds.env == "native":
        errors += _native_id(ds.id, f"{where}.id")
    if ds.reward != EvalRewardConfig():
        errors.append(ConfigError(f"{where}.reward", {k: v for k, v in vars(ds.reward).items() if v is not None},
                                  "cannot be given with an environment: the episodes' reward is the reward",
                                  f"drop {where}.reward"))
    if ds.stop is not None:
        errors.append(ConfigError(f"{where}.stop", list(ds.stop), "an environment's turns end at the chat "
                                  "template's end of turn", f"drop {where}.stop"))
    if ds.task == "swe":
        errors.append(ConfigError(f"{where}.task", "swe", "SWE tasks are worked by coding agents, not environments",
                                  f"{where}.task=jsonl {where}.path=ROWS for environments that take dataset rows"))
    return errors


def datasets(cfg: SlimeConfig) -> list[ConfigError]:
    errors = []
    for i, ds in enumerate(cfg.eval.datasets):
        where = f"eval.datasets[{i}]"
        errors += _environment(ds, where)
        if ds.env is None and ds.id is None and not ds.args:  # an id or args alone: it meant an environment
            errors += _source(cfg, ds, where) + _reward(cfg, ds, where)
    return errors


RULES = [schedule, names, datasets]
