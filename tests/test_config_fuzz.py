"""Config fuzz: random override sets and random recipe files through the real CLI entry.

Unknown keys, wrong types, bad members, interpolations, deletions (`~key`), additions (`+key`, `++key`),
hostile numbers and nesting: every command ends with exit 0 or 2, never a traceback. Seeded and bounded
(the same examples every run), in-process through the typer app, plus a few runs as real processes.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from slimecli.cli.app import app
from slimecli.config.compose import load
from slimecli.config.convert import schema_paths
from slimecli.config.errors import ConfigErrors
from slimecli.config.paths import group_members
from slimecli.config.recipes import available
from slimecli.config.schema import GROUPS, SlimeConfig
from tests.helpers import invoke_cli

PATHS = schema_paths(SlimeConfig)
RECIPES = sorted(available())
FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _typo(word: str, r: random.Random) -> str:
    i = r.randrange(len(word))
    return word[:i] + r.choice("xqz_.") + word[i + 1:]


keys = st.one_of(
    st.sampled_from(PATHS),
    st.builds(_typo, st.sampled_from(PATHS), st.randoms(use_true_random=False)),
    st.from_regex(r"[a-z_]{1,8}(\.[a-z_]{1,8}){0,3}", fullmatch=True),
    st.sampled_from(["hydra.run.dir", "recipe", "trainer", "a..b", ".x", "x.", "trainer.max_steps.deeper"]),
)
scalars = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70).map(str),
    st.sampled_from(["9" * 5000, "1" + "0" * 400, "1e999", "-1e999", "inf", "-inf", "nan", "0", "-1", "1e-320"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "null", "''", '""', "abc", "'a b'", "\\", "'", "{", "[", "]", ":", "=", "@"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
)
interpolations = st.one_of(
    st.sampled_from(PATHS).map(lambda p: "${" + p + "}"),
    st.sampled_from(["${nope}", "${oc.env:SLIMECLI_FUZZ_UNSET}", "${oc.env:HOME}", "${oc.env:HOME,x}",
                     "${oc.decode:'[1,2'}", "${oc.select:trainer.max_steps,3}", "${", "${}", "${a:b}",
                     "x${trainer.max_steps}y", "${trainer}", "${oc.create:'{a: 1}'}"]),
)
values = st.recursive(
    st.one_of(scalars, interpolations),
    lambda inner: st.one_of(st.lists(inner, max_size=3).map(lambda v: "[" + ",".join(v) + "]"),
                            st.lists(st.tuples(st.from_regex(r"[a-z]{1,5}", fullmatch=True), inner), max_size=3)
                            .map(lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}")),
    max_leaves=6,
) | st.integers(min_value=30, max_value=400).map(lambda d: "[" * d + "1" + "]" * d)

group_choices = st.sampled_from(GROUPS).flatmap(
    lambda g: st.one_of(st.sampled_from(group_members(g)), st.sampled_from(["nosuch", "null", "[a,b]", "''"]))
    .map(lambda m: f"{g}={m}"))
overrides = st.one_of(
    st.tuples(st.sampled_from(["", "+", "++"]), keys, values).map(lambda t: f"{t[0]}{t[1]}={t[2]}"),
    keys.map(lambda k: f"~{k}"),
    st.tuples(keys, values).map(lambda t: f"~{t[0]}={t[1]}"),
    group_choices,
    st.sampled_from(RECIPES + ["nosuch", "/etc/passwd", "/nonexistent/x.yaml", "~nosuchuser/x.yaml", "a" * 5000])
    .map(lambda r: f"+recipe={r}"),
    st.sampled_from(["optimizer.lr=choice(1,2)", "x=range(1,3)", "trainer.max_steps=int(3.5)", "=1", "==", "",
                     "key", "+", "~", "a=b=c", "trainer.max_steps=3 4"]),
)
override_sets = st.lists(overrides, max_size=6)


def _invoke(args: list[str]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 2), f"{args!r} -> exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert "Traceback" not in result.output, args
    return result


@pytest.mark.slow
@seed(20261204)
@FUZZ
@given(override_sets, st.sampled_from(["show", "show", "validate"]))
def test_random_override_sets_exit_0_or_2(ovs, command):
    _invoke(["config", command, *ovs])


@seed(20261205)
@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(["# @package _global_", "defaults:", "  - override /teacher: server", "  - 42",
                              "  - override /nosuch: x", "trainer:", "  max_steps: 3", "\tmax_steps: 3",
                              "run: {name: ${oc.env:SLIMECLI_FUZZ_UNSET}}", "x: [1, 2", "optimizer:",
                              "  lr: 1e999", "  lr: .nan", "recipe: 3", "hydra: {}", "- a", "'", ": :"]),
             max_size=8).map("\n".join),
))
@pytest.mark.slow
def test_random_recipe_files_are_read_or_refused(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("recipe") / "fuzzed.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    try:
        load([f"+recipe={path}"])
    except ConfigErrors as exc:
        assert exc.errors and exc.render()


def test_a_few_hostile_sets_as_real_processes():
    sets = [
        ["+recipe=opd", "optimizer.lr=" + "9" * 6000, "~trainer.max_steps", "+trainer.new=${nope}"],
        ["optimizer=nosuch", "trainer.max_steps=abc", "run.name=${oc.env:SLIMECLI_FUZZ_UNSET}", "a..b=1"],
        ["rollout.sglang_args=" + "[" * 500 + "]" * 500, "optimizer.betas=[nan,inf]", "+recipe=/etc/passwd"],
    ]
    for args in sets:
        for command in ("show", "validate"):
            out = invoke_cli("config", command, *args)
            assert out.returncode == 2, (args, out.stdout, out.stderr)
            assert "Traceback" not in out.stderr and "config error" in out.stderr, out.stderr
