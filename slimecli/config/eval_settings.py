"""A dataset of eval.datasets resolved against the run's settings: the sampling, task source and reward it is
evaluated with (the evaluator and the eval rules read the same values)."""

from __future__ import annotations

from dataclasses import replace

from slimecli.config.groups.env import EnvConfig, EnvSourceConfig
from slimecli.config.groups.eval import EvalDatasetConfig, EvalRewardConfig
from slimecli.config.groups.reward import RewardConfig
from slimecli.config.groups.rollout import RolloutConfig
from slimecli.config.groups.task import TaskConfig

REWARD_FIELDS = ("name", "key", "path", "group", "url", "timeout_s", "max_retries", "backoff_s", "concurrency",
                 "on_invalid", "partial", "rubric", "verdict", "verdict_regex", "verdict_schema", "score_max")
# reward=judge on a dataset takes these from the run's reward: where an embedded judge listens always (the run
# starts one judge), and the rest when the run's reward names a judge (reward.judge_url)
JUDGE_PLACE = ("judge_host", "judge_port")
JUDGE_SERVER_FIELDS = ("judge_url", "judge_api", "judge_model", "judge_api_key", *JUDGE_PLACE)
SAMPLING_FIELDS = ("n_samples_per_prompt", "max_new_tokens", "temperature", "top_p", "top_k", "max_prompt_len")
TASK_REWARD = {"swe": "swe_tests", "quickstart": "quickstart"}  # a task kind and the reward member that grades it


def member_reward(name: str) -> RewardConfig:
    """The reward group member `name` as `reward=NAME` would compose it (its YAML over the schema defaults)."""
    import yaml

    from slimecli.config.convert import build
    from slimecli.config.errors import ConfigError
    from slimecli.config.paths import conf_dir

    path = conf_dir() / "reward" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    errors: list[ConfigError] = []
    out = build(RewardConfig, {**(data if isinstance(data, dict) else {}), "name": name}, "reward", errors)
    return out if out is not None else RewardConfig(name=name)


def dataset_reward(ds: EvalDatasetConfig, run: RewardConfig) -> RewardConfig:
    """The reward a dataset is scored with: its own keys over the run's reward, or over the member it names."""
    override: EvalRewardConfig = ds.reward
    name = override.name or TASK_REWARD.get(ds.task) or run.name
    base = run if name == run.name else member_reward(name)
    changes = {k: getattr(override, k) for k in REWARD_FIELDS if getattr(override, k) is not None}
    if name == "judge" and base is not run:  # the run's judge: where it listens, and which it is when the run names one
        changes = {**{k: getattr(run, k) for k in JUDGE_SERVER_FIELDS if run.judge_url or k in JUDGE_PLACE}, **changes}
    return replace(base, **changes)


def dataset_env(ds: EvalDatasetConfig, env: EnvConfig) -> EnvConfig:
    """An environment dataset as the run's env group sees it: one source labelled by the dataset's name, on the
    environment's "eval" split, with the run's budgets (max_turns, timeouts, constrain, ...)."""
    source = EnvSourceConfig(name=ds.name, env=ds.env or "native", id=ds.id or "", args=dict(ds.args))
    return replace(env, name="mix", id=None, args={}, mix=(source,), split="eval")


def dataset_sampling(ds: EvalDatasetConfig, rollout: RolloutConfig) -> RolloutConfig:
    """The run's rollout settings with the dataset's sampling overrides."""
    changes = {k: getattr(ds, k) for k in SAMPLING_FIELDS if getattr(ds, k) is not None}
    return replace(rollout, **changes)


def dataset_task(ds: EvalDatasetConfig, task: TaskConfig) -> TaskConfig:
    """The dataset as a task source (the same readers as `task`), in file order."""
    template = task.apply_chat_template if ds.apply_chat_template is None else ds.apply_chat_template
    return TaskConfig(name=ds.task, path=ds.path, prompt_key=ds.prompt_key, label_key=ds.label_key,
                      apply_chat_template=template, shuffle=False)
