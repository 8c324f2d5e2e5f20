"""The schema says what a value may be: every int and float field has its bounds in its spec (or a note that says
why it has none), every closed set of words is a Literal, and deprecated spellings never get past the config layer."""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from slimecli.config.canonical import canonicalize
from slimecli.config.compose import load
from slimecli.config.decode import field_specs, field_types
from slimecli.config.errors import ConfigErrors
from slimecli.config.io import load_frozen, save_frozen
from slimecli.config.registry import Registry
from slimecli.config.schema import SlimeConfig
from tests.helpers.config_errors import errors_of

# str fields whose words are open by nature, by the last part of their name: paths, URLs, hosts, names of things
# that are registered (a registry backs them) or defined elsewhere (a dataset, a model), keys into data, free text
OPEN_BY_NAME = ("path", "dir", "root", "roots", "url", "host", "addr", "file", "key", "id", "name", "binary", "image",
                "args", "lines", "prompt", "regex", "project", "output", "tools", "hosts")
# the other str fields, each with why its values are not a closed set
OPEN_STR = {
    "cluster.partition": "a SLURM partition of the user's cluster",
    "cluster.time": "a SLURM time limit (HH:MM:SS, D-HH:MM, ...)",
    "cluster.account": "a SLURM account of the user's cluster",
    "trainer.advantage_estimator": "a registered estimator or an import path",
    "trainer.policy_loss": "a registered policy loss or an import path",
    "trainer.off_policy_correction": "a registered correction or an import path",
    "trainer.lora.target_modules": "module names of the model",
    "rollout.device": "auto, cpu, cuda or cuda:N (any N)",
    "rollout.generate": "a registered rollout kind or an import path",
    "rollout.replay": "a rollout dump directory",
    "agent.tool_parser": "qwen, hermes or an import path",
    "agent.harness": "an import path",
    "agent.adapter": "an import path",
    "agent.choices_final": "free text",
    "env.tool_parser": "a registered tool parser or an import path",
    "env.split": "a split of the environment's own dataset",
    "sandbox.extra_ro_paths": "host paths",
    "sandbox.container_runtime": "an OCI runtime installed on the host (runc, crun, runsc, ...)",
    "task.instance": "a SWE task's instance id",
    "teacher_default": "the name of one of the run's teachers (teachers[].name)",
    "task.workdir": "a directory",
    "eval.datasets[].stop": "stop strings",
    "recipe": "a recipe name or a recipe file",
    "reward.judge_model": "a model name or checkpoint",
    "reward.rubric": "free text: the judge's prompt",
    "reward.verdict_schema": "a JSON schema's text",
    "eval.datasets[].reward.rubric": "free text: the judge's prompt",
    "eval.datasets[].reward.verdict_schema": "a JSON schema's text",
}


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, typing.Any, typing.Any]]:
    """(path, type, spec) of every leaf field; lists of dataclasses are walked as `path[]`."""
    for name, tp in field_types(cls).items():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from leaves(tp, path)
            continue
        inner = [a for a in scalars(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        for dc in inner:
            yield from leaves(dc, f"{path}[]")
        if not inner:
            yield path, tp, field_specs(cls)[name]


def scalars(tp: typing.Any) -> list[typing.Any]:
    """The scalar types a field's type holds: `int | None` -> [int, NoneType], `tuple[str, ...]` -> [str]."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, list, tuple, frozenset):
        return [s for a in typing.get_args(tp) if a is not Ellipsis for s in scalars(a)]
    return [tp]


def test_every_int_and_float_field_has_bounds_or_says_why_not() -> None:
    numbers = [(path, spec) for path, tp, spec in leaves(SlimeConfig) if {int, float} & set(scalars(tp))]
    assert len(numbers) > 50  # the walk sees the whole schema, nested groups and lists of datasets included
    unbounded = [path for path, spec in numbers if not spec.bounded and not spec.note]
    assert not unbounded, f"int/float fields without bounds or a note saying why: {unbounded}"


def test_no_str_field_is_a_closed_set_of_words() -> None:
    """A closed set is a Literal (the decoder checks it, with a did-you-mean); each plain str is open, and says why."""
    strings = [path for path, tp, _ in leaves(SlimeConfig) if str in scalars(tp)]
    unexplained = [p for p in strings if p not in OPEN_STR and not p.rsplit(".", 1)[-1].endswith(OPEN_BY_NAME)]
    assert not unexplained, f"plain str fields: make each a Literal, or say in OPEN_STR why it is open: {unexplained}"
    assert set(OPEN_STR) <= set(strings), set(OPEN_STR) - set(strings)  # the list keeps up with the schema


def test_constrain_words_are_literals_checked_with_a_did_you_mean() -> None:
    (msg,) = errors_of(["agent.constrain=choice"])
    assert msg.startswith("agent.constrain: not an allowed value (got 'choice')") and "did you mean 'choices'?" in msg
    (msg,) = errors_of(["agent.choices_then=finale"])
    assert msg.startswith("agent.choices_then: not an allowed value (got 'finale')")


def test_new_bounds_name_the_field() -> None:
    msgs = errors_of(["trainer.gamma=1.5", "trainer.kl_loss_coef=-1", "trainer.save_interval=-1",
                      "rollout.max_connections=0"])
    assert "trainer.gamma: must be in [0, 1] (got 1.5)" in msgs
    assert "trainer.kl_loss_coef: must be >= 0 (got -1.0)" in msgs
    assert "trainer.save_interval: must be >= 0 (0 = only at the end) (got -1)" in msgs
    assert "rollout.max_connections: must be > 0 (got 0)" in msgs
    assert load(["trainer.keep_checkpoints=-1"]).trainer.keep_checkpoints == -1  # keeps every checkpoint, as before


def test_gspo_is_rewritten_at_the_boundary_with_a_deprecation_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="slimecli.config"):
        t = load(["trainer.advantage_estimator=gspo"]).trainer
    assert (t.advantage_estimator, t.importance_level) == ("grpo", "sequence")
    assert [r.getMessage() for r in caplog.records] == [
        "trainer.advantage_estimator=gspo is deprecated: it is read as trainer.advantage_estimator=grpo "
        "trainer.importance_level=sequence; set that instead"]
    t = load(["trainer.use_tis=true"]).trainer
    assert (t.use_tis, t.off_policy_correction) == (False, "tis")


def test_errors_about_a_rewritten_key_name_the_key_the_user_wrote() -> None:
    (msg,) = errors_of(["trainer.use_tis=true", "trainer.use_rollout_logprobs=true"])
    assert msg.startswith("trainer.use_tis: an off-policy correction weighs recomputed old log-probs")
    assert "(got True)\n    hint: set trainer.use_tis back or trainer.use_rollout_logprobs=false" in msg
    (msg,) = errors_of(["trainer.use_tis=true", "trainer.off_policy_correction=mis"])
    assert msg.startswith("trainer.use_tis: is the deprecated spelling of trainer.off_policy_correction=tis")


def test_a_run_frozen_with_the_old_spelling_is_read_in_the_new(tmp_path: Path) -> None:
    path = save_frozen(SlimeConfig(), tmp_path / "config.yaml")
    path.write_text(path.read_text().replace("advantage_estimator: grpo", "advantage_estimator: gspo"))
    t = load_frozen(path).trainer
    assert (t.advantage_estimator, t.importance_level) == ("grpo", "sequence")
    assert canonicalize({"trainer": "not a mapping"}) == []  # a bad section is the decoder's to report
    path.write_text("trainer: {advantage_estimator: gspo, use_tis: true, gamma: 2}\n")
    with pytest.raises(ConfigErrors, match=r"trainer.gamma: must be in \[0, 1\]"):
        load_frozen(path)


def test_a_name_bound_to_another_object_is_refused_and_the_same_object_again_is_a_no_op() -> None:
    registry: Registry[typing.Callable[..., int]] = Registry("thing", "thing.name")

    def first() -> int:
        return 1

    def second() -> int:
        return 2

    assert registry.register("one", first) is first
    registry.register("one", first)  # a module imported twice
    with pytest.raises(ValueError, match=r"thing 'one' is already registered to .*first; cannot register .*second"):
        registry.register("one", second)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("one", first, flavour="other")  # other options: another binding
    assert registry.get("one").fn is first
    with registry.override(one=second):  # tests swap an entry in on purpose
        assert registry.get("one").fn is second
    assert registry.get("one").fn is first


def test_a_builtin_whose_module_registers_itself_is_the_same_binding() -> None:
    registry: Registry[typing.Callable[..., object]] = Registry("thing", "thing.name")
    registry.builtin("load", "slimecli.config.io:load_frozen")
    registry.register("load", load_frozen)  # the lazy target's own object: no conflict
    assert registry.get("load").fn is load_frozen
    with pytest.raises(ValueError, match="already registered to slimecli.config.io:load_frozen"):
        registry.register("load", save_frozen)
