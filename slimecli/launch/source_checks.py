"""Pre-flight for the files a config names: the model and teacher checkpoints, the task file (every SWE row
parsed, the built-in sets built with git) and each eval dataset's, the reward functions (the run's and each
eval dataset's) and the functions rollout.generate, trainer.advantage_estimator and trainer.policy_loss name
by import path (found without importing them), and every environment (the run's, each eval dataset's) loads. The config layer checks only what the
config says; every command reads its config through `load` here, so these are reported with the rules'
errors, all at once, before anything starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from slimecli.config.errors import ConfigError, did_you_mean
from slimecli.config.eval_settings import dataset_reward, dataset_task
from slimecli.config.groups.reward import RewardConfig
from slimecli.config.groups.task import TaskConfig
from slimecli.config.import_path import FORMAT_HINT, check_import_path, is_import_path, syntax_error
from slimecli.config.registry import ADVANTAGE_ESTIMATORS, GENERATE_KINDS, POLICY_LOSSES
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import run_teachers

MAX_LISTED = 20  # row errors shown in full; the rest are counted


def load(overrides: Sequence[str] = (), recipe_dirs: tuple[str, ...] = (), uses_agent: bool = False,
         resume: bool = False) -> SlimeConfig:
    """The config as commands read it: composed, the schema and rules checked, and the files it names read.
    ``resume``: where run.dir names a run that exists, its stored config with the overrides on top (`train`,
    `plan`, `config`: config/resume.py)."""
    from slimecli.config.compose import Composer
    from slimecli.config.compose import load as compose_load
    from slimecli.launch.compose_cache import compose_cached

    composer: Composer = compose_cached  # the same tree composed before: no Hydra at all
    if resume:
        from functools import partial

        from slimecli.config.resume import compose_onto
        from slimecli.launch.rundir import stored_config

        stored = stored_config(list(overrides))
        if stored is not None:
            composer = partial(compose_onto, stored)
    return compose_load(overrides, recipe_dirs, uses_agent, checks=source_errors, composer=composer)


def source_errors(cfg: SlimeConfig) -> list[ConfigError]:
    errors = model_dirs(cfg) + teacher_dir(cfg) + reward_functions(cfg) + plugin_functions(cfg)
    if cfg.env.name == "none":
        errors += task_errors(cfg.task)
    else:  # the environment's tasks, or task.path's rows as they are
        from slimecli.env.check import source_errors as env_errors

        errors += env_errors(cfg)
    for i, ds in enumerate(cfg.eval.datasets):
        if ds.env is not None:
            errors += env_dataset_errors(cfg, i)
        elif ds.task != "quickstart":
            errors += _scoped(task_errors(dataset_task(ds, cfg.task)), f"eval.datasets[{i}]")
    return errors


def env_dataset_errors(cfg: SlimeConfig, i: int) -> list[ConfigError]:
    """eval.datasets[i]'s environment loads and has eval tasks (its own, else the dataset's path rows); an id the
    eval rules already refuse is not loaded."""
    from slimecli.config.eval_settings import dataset_env
    from slimecli.config.rules.env import _native_id
    from slimecli.env.check import source_errors as env_errors

    ds, where = cfg.eval.datasets[i], f"eval.datasets[{i}]"
    if not ds.id or (ds.env == "native" and _native_id(ds.id, "id")):
        return []
    scoped = replace(cfg, env=dataset_env(ds, cfg.env), task=dataset_task(ds, cfg.task))
    keys = {"env.mix[0].id": f"{where}.id", "task.path": f"{where}.path"}
    return [replace(e, path=keys.get(e.path, e.path), reason=e.reason.replace("task=jsonl task.path=", f"{where}.path="))
            for e in env_errors(scoped)]


def reward_functions(cfg: SlimeConfig) -> list[ConfigError]:
    """The run's reward.path, and each eval dataset's own, name a function that is there (nothing is imported)."""
    errors = reward_function(cfg.reward, "reward.path")
    for i, ds in enumerate(cfg.eval.datasets):
        reward = dataset_reward(ds, cfg.reward)
        if reward != cfg.reward:  # the run's own reward is reported once, above
            errors += reward_function(reward, f"eval.datasets[{i}].reward.path")
    return errors


def reward_function(reward: RewardConfig, key: str) -> list[ConfigError]:
    problem = check_import_path(reward.path) if reward.path is not None else None
    return [ConfigError(key, reward.path, f"cannot find the reward function: {problem}", FORMAT_HINT)] if problem else []


def plugin_functions(cfg: SlimeConfig) -> list[ConfigError]:
    """A plugin field given as an import path names a function that is there (nothing is imported); a malformed
    path is the config rule's error, reported there once."""
    errors = []
    for registry, value in ((GENERATE_KINDS, cfg.rollout.generate),
                            (ADVANTAGE_ESTIMATORS, cfg.trainer.advantage_estimator),
                            (POLICY_LOSSES, cfg.trainer.policy_loss)):
        problem = check_import_path(value) if is_import_path(value) and syntax_error(value) is None else None
        if problem:
            errors.append(ConfigError(registry.config_key, value, f"cannot find the {registry.kind}: {problem}"))
    return errors


def _checkpoint(path: str, key: str) -> list[ConfigError]:
    p = Path(path).expanduser()
    if not p.is_dir():
        return [ConfigError(key, path, "directory does not exist")]
    if not (p / "config.json").is_file():
        return [ConfigError(key, path, "not a Hugging Face checkpoint (no config.json)")]
    return []


def model_dirs(cfg: SlimeConfig) -> list[ConfigError]:
    m = cfg.model
    errors = _checkpoint(m.path, "model.path") if m.path is not None else []
    if m.tokenizer_path is not None and not Path(m.tokenizer_path).expanduser().is_dir():
        errors.append(ConfigError("model.tokenizer_path", m.tokenizer_path, "directory does not exist"))
    return errors


def teacher_dir(cfg: SlimeConfig) -> list[ConfigError]:
    """Each launched teacher's checkpoint directory (config/teachers.py)."""
    errors = []
    for teacher in run_teachers(cfg):
        t = teacher.settings
        if t.name == "server" and not t.url and t.model_path is not None:
            errors += _checkpoint(t.model_path, f"{teacher.key}.model_path")
    return errors


def task_errors(t: TaskConfig) -> list[ConfigError]:
    """task=jsonl: the file exists; task=swe: the task file loads and every row is well-formed."""
    if t.name == "jsonl" and t.path and not Path(t.path).expanduser().is_file():
        return [ConfigError("task.path", t.path, "file does not exist")]
    if t.name != "swe" or not t.path:
        return []
    from slimecli.swe.task import TaskFileError, load_for

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


def _scoped(errors: list[ConfigError], where: str) -> list[ConfigError]:
    """A dataset's task errors under its own key (eval.datasets[1].path)."""
    return [replace(e, path=f"{where}.path" if e.path == "task.path" else e.path, hint=e.hint.replace(
        "task.path", f"{where}.path").replace("task=jsonl", f"{where}.task=jsonl").replace("task=swe", f"{where}.task=swe"))
        for e in errors]
