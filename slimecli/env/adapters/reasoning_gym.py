"""reasoning-gym's procedural datasets as single-turn environments: the dataset's entries are the tasks, the policy's
answer is read from <answer></answer> tags (reasoning_gym.utils.extract_answer) and scored by the dataset's own
score_answer, partial credit included.

env.id is a registered dataset name (`slimecli env list`, "composite" for a weighted mix) and env.args its config
(size, seed, difficulty knobs), plus this adapter's own keys:
- system_prompt: a name in reasoning_gym.utils.SYSTEM_PROMPTS or the text itself; null for none. Default "direct"
  (answer in <answer> tags, no preamble) while answer_tag is "answer", else none.
- answer_tag: the tag the answer is read from (default "answer"); null: the whole reply (markup aside) is the answer,
  for policies that cannot yet write tags (a randomly initialised model).
- eval_seed, eval_size: the "eval" split (below).

Splits: "train" is the dataset as configured; a missing seed is 0 (reasoning-gym would draw a random one: a run must
be reproducible and resumable). "eval" is the same config with seed eval_seed (default seed + size: entry i is drawn
from Random(seed + i), so these are other draws) and size eval_size (default size), without the entries whose
question is also in "train": the splits are disjoint even where the problem space is small.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from slimecli.config.errors import did_you_mean
from slimecli.config.groups.env import EnvConfig
from slimecli.env.adapters import library
from slimecli.env.protocol import Action, Observation, StepResult
from slimecli.env.provider import EnvLoadError, EnvNotFound, EnvProvider

KIND = "reasoning_gym"
OWN_ARGS = ("system_prompt", "answer_tag", "eval_seed", "eval_size")
SPLITS = ("train", "eval")
UNSET = object()


def available() -> list[tuple[str, str]]:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return []
    return [(name, cls.__module__) for name, (cls, _) in sorted(DATASETS.items())]


def _did_you_mean(word: str, choices: list[str]) -> str:
    hint = did_you_mean(word, choices)
    return f" ({hint})" if hint else ""


def _check_config(name: str, config: Mapping[str, Any], where: str) -> None:
    """Unknown keys named before the dataclass's own TypeError would (it names only the first)."""
    from reasoning_gym.factory import DATASETS

    fields = [f.name for f in dataclasses.fields(DATASETS[name][1])]
    for key in config:
        if key not in fields:
            raise EnvLoadError(f"env={KIND}: dataset {name!r} has no config key {key!r} ({where}.{key})"
                               f"{_did_you_mean(str(key), fields)}; its keys: {', '.join(fields)}")


def _composite_specs(datasets: Any) -> list[Any]:
    """The composite's `datasets` as DatasetSpec objects (YAML gives mappings: name, weight, config)."""
    from reasoning_gym.composite import DatasetSpec
    from reasoning_gym.factory import DATASETS

    if not isinstance(datasets, (list, tuple)) or not datasets:
        raise EnvLoadError(f"env={KIND}: composite needs env.args.datasets, a list of {{name, weight, config}}")
    specs = []
    for i, ds in enumerate(datasets):
        if isinstance(ds, DatasetSpec):
            ds = dataclasses.asdict(ds)
        if not isinstance(ds, Mapping) or not isinstance(ds.get("name"), str):
            raise EnvLoadError(f"env={KIND}: env.args.datasets[{i}] must be a mapping with a 'name', not {ds!r}")
        extra = set(ds) - {"name", "weight", "config"}
        if extra:
            raise EnvLoadError(f"env={KIND}: env.args.datasets[{i}] has unknown key {sorted(extra)[0]!r}; "
                               "allowed: name, weight, config")
        if ds["name"] not in DATASETS or ds["name"] == "composite":
            raise EnvLoadError(f"env={KIND}: env.args.datasets[{i}].name: no dataset {ds['name']!r}"
                               f"{_did_you_mean(ds['name'], sorted(DATASETS))}")
        config = dict(ds.get("config") or {})
        _check_config(ds["name"], config, f"env.args.datasets[{i}].config")
        specs.append(DatasetSpec(name=ds["name"], weight=float(ds.get("weight", 1.0)), config=config))
    return specs


def _create(name: str, config: Mapping[str, Any]) -> Any:
    import reasoning_gym

    kwargs = dict(config)
    if name == "composite" and "datasets" in kwargs:
        kwargs["datasets"] = _composite_specs(kwargs["datasets"])
    try:
        return reasoning_gym.create_dataset(name, **kwargs)
    except EnvLoadError:
        raise
    except Exception as exc:
        detail = str(exc) or type(exc).__name__
        raise EnvLoadError(f"env={KIND}: dataset {name!r} rejected its config {dict(config)!r}: {detail}") from exc


def load(env_id: str, args: Mapping[str, Any], cfg: EnvConfig) -> ReasoningGymProvider:
    library(KIND, "reasoning_gym", "the reasoning-gym library")
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if env_id not in DATASETS:
        known = sorted(DATASETS)
        hint = did_you_mean(env_id, known)
        raise EnvNotFound(KIND, env_id, known, "not a reasoning-gym dataset" + (f"; {hint}" if hint else ""))
    config = {k: v for k, v in args.items() if k not in OWN_ARGS}
    _check_config(env_id, config, "env.args")
    config.setdefault("seed", 0)

    tag = args.get("answer_tag", "answer")
    if tag is not None and (not isinstance(tag, str) or not tag.strip()):
        raise EnvLoadError(f"env={KIND}: env.args.answer_tag must be a tag name (e.g. answer) or null, not {tag!r}")
    prompt = args.get("system_prompt", UNSET)
    if prompt is UNSET:
        prompt = SYSTEM_PROMPTS["direct"] if tag == "answer" else None
    elif prompt is not None and not isinstance(prompt, str):
        raise EnvLoadError(f"env={KIND}: env.args.system_prompt must be text, a name in SYSTEM_PROMPTS "
                           f"({', '.join(SYSTEM_PROMPTS)}) or null")
    elif isinstance(prompt, str):
        prompt = SYSTEM_PROMPTS.get(prompt, prompt) or None
    for key in ("eval_seed", "eval_size"):
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or (key == "eval_size" and value <= 0)):
            raise EnvLoadError(f"env={KIND}: env.args.{key} must be a{' positive' if key == 'eval_size' else 'n'} "
                               f"integer, not {value!r}")
    dataset = _create(env_id, config)
    return ReasoningGymProvider(env_id, args, dataset, config, prompt, tag)


class ReasoningGymProvider(EnvProvider):
    kind = KIND

    def __init__(self, env_id: str, args: Mapping[str, Any], dataset: Any, config: dict[str, Any],
                 system_prompt: str | None, answer_tag: str | None) -> None:
        super().__init__(env_id, args)
        self.dataset, self.config = dataset, config
        self.system_prompt, self.answer_tag = system_prompt, answer_tag
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def describe(self) -> str:
        return f"{KIND}:{self.env_id} (seed {self.dataset.seed}, size {len(self.dataset)})"

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        if split not in SPLITS:
            raise ValueError(f"env={KIND}: no split {split!r}; the splits are {', '.join(SPLITS)}")
        if split not in self._rows:
            self._rows[split] = self._train() if split == "train" else self._eval()
        return self._rows[split]

    def _train(self) -> list[dict[str, Any]]:
        return [_row(self.dataset[i], i) for i in range(len(self.dataset))]

    def _eval(self) -> list[dict[str, Any]]:
        seed, size = self.dataset.seed, len(self.dataset)
        eval_seed = self.args.get("eval_seed")
        eval_size = self.args.get("eval_size") or size
        seen = {row["question"] for row in self.tasks("train")}
        pool = _create(self.env_id, {**self.config, "seed": seed + size if eval_seed is None else eval_seed,
                                     "size": eval_size * 4})
        rows: list[dict[str, Any]] = []
        for i in range(len(pool)):
            entry = pool[i]
            if entry["question"] not in seen:
                seen.add(entry["question"])
                rows.append(_row(entry, len(rows)))
                if len(rows) == eval_size:
                    break
        if not rows:
            raise ValueError(f"env={KIND}: {self.env_id}'s eval split is empty: every question it draws is also in "
                             "the train split (the config's problem space is too small; widen it, or lower size)")
        return rows

    def episode(self) -> ReasoningGymEpisode:
        return ReasoningGymEpisode(self)


def _row(entry: Mapping[str, Any], index: int) -> dict[str, Any]:
    return {"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {}),
            "index": index}


class ReasoningGymEpisode:
    """One question, one answer."""

    def __init__(self, provider: ReasoningGymProvider) -> None:
        self.provider = provider
        self.entry: dict[str, Any] | None = None

    async def reset(self, task: Mapping[str, Any]) -> Observation:
        if not isinstance(task.get("question"), str) or "answer" not in task:
            raise ValueError(f"env={KIND}: a task row needs 'question' and 'answer' (the provider's own rows); "
                             f"got keys {sorted(map(str, task))}")
        self.entry = {"question": task["question"], "answer": task["answer"], "metadata": task.get("metadata") or {}}
        messages = [{"role": "system", "content": self.provider.system_prompt}] if self.provider.system_prompt else []
        return Observation(messages=[*messages, {"role": "user", "content": task["question"]}], tools=None)

    async def step(self, action: Action) -> StepResult:
        if self.entry is None:
            raise RuntimeError("step() before reset()")
        answer = _extract(action.content, self.provider.answer_tag)
        score = await asyncio.to_thread(self.provider.dataset.score_answer, answer, self.entry)
        return StepResult(reward=float(score), done=True, info={"answer": answer, "expected": self.entry["answer"]})

    async def close(self) -> None:
        self.entry = None


def _extract(content: str, tag: str | None) -> str | None:
    if tag is None:
        return content.strip()
    from reasoning_gym.utils import extract_answer

    return extract_answer(content, tag_name=tag)  # type: ignore[no-any-return]
