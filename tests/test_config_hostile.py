"""Hostile input to the config loader: every class of bad override or recipe file is a config error
(exit 2, the key or the file named), never a traceback, and never silently accepted."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path

import pytest

from slimecli.config.compose import load
from slimecli.config.convert import build, field_types
from slimecli.config.decode import spec, spec_of
from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.io import load_frozen
from slimecli.config.schema import SlimeConfig
from tests.helpers import invoke_cli
from tests.helpers.config_errors import errors_of


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# ---- overrides ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("override", "expected"), [
    ("optimizer.lr=" + "9" * 6000, "optimizer.lr: cannot read the value"),
    ("optimizer.lr=1" + "0" * 400, "optimizer.lr: number out of range"),
    ("trainer.max_steps=1" + "0" * 400, "trainer.max_steps: integer out of range (it must fit in 64 bits)"),
    ("trainer.max_steps=" + str(2**63), "trainer.max_steps: integer out of range"),
    ("optimizer.lr=" + nested(300), "optimizer.lr: value nested too deep (at most 32 levels)"),
    ("optimizer.lr=" + nested(3000), "optimizer.lr: value nested too deep"),
    ("rollout.sglang_args={a:" + nested(100) + "}", "rollout.sglang_args: value nested too deep"),
    ("optimizer.lr=1e999", "optimizer.lr: must be a finite number (got inf)"),
    ("optimizer.lr=-inf", "optimizer.lr: must be a finite number (got -inf)"),
    ("optimizer.lr=nan", "optimizer.lr: expected a number, not NaN"),
    ("optimizer.lr=${oc.env:SLIMECLI_TEST_SURELY_UNSET}", "optimizer.lr: cannot resolve the interpolation"),
    ("optimizer.lr=${optimizer.lr}", "optimizer.lr: cannot resolve the interpolation: Recursive interpolation"),
    ("run.name=${no.such.key}", "run.name: cannot resolve the interpolation: Interpolation key 'no.such.key' not found"),
    ("optimizer.lr=choice(1e-6,1e-5)", "optimizer.lr: sweeps are not supported here"),
    ("optimizer.lr=" + "x" * 200_000, "optimizer.lr: override too long"),
    ("~optimizer.lr", "optimizer.lr: deleting keys is not supported"),
])
def test_hostile_override_is_one_config_error(override, expected):
    msgs = errors_of([override])
    assert len(msgs) == 1 and msgs[0].startswith(expected), msgs
    assert len(msgs[0]) < 1000  # the value is shortened in the message


def test_interpolations_in_overrides_resolve_like_hydra(monkeypatch):
    monkeypatch.setenv("SLIMECLI_TEST_NAME", "fromenv")
    cfg = load(["run.name=${oc.env:SLIMECLI_TEST_NAME}-${trainer.max_steps}", "trainer.max_steps=7"])
    assert cfg.run.name == "fromenv-7"


def every_float_field(cls: type = SlimeConfig, prefix: str = "") -> list[tuple[str, bool]]:
    """(path, accepts inf) for each float (or optional float) field reachable through plain dataclass fields."""
    out = []
    for f in dataclasses.fields(cls):
        tp = field_types(cls)[f.name]
        path = f"{prefix}{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += every_float_field(tp, path + ".")
        elif tp is float or (typing.get_origin(tp) in (typing.Union, types.UnionType) and float in typing.get_args(tp)):
            out.append((path, spec_of(f).non_finite))
    return out


def test_every_float_field_refuses_infinity_unless_it_says_otherwise():
    fields = every_float_field()
    assert len(fields) > 10
    msgs = "\n".join(errors_of([f"{path}=inf" for path, _ in fields]))
    for path, allowed in fields:
        assert (f"{path}: must be a finite number" in msgs) != allowed, path


def test_a_field_may_allow_infinity_explicitly():
    @dataclasses.dataclass(frozen=True)
    class Limits:
        timeout_s: float = spec(math.inf, non_finite=True)
        lr: float = 1e-6

    errors: list[ConfigError] = []
    built = build(Limits, {"timeout_s": float("inf"), "lr": float("inf")}, "x", errors)
    assert built is not None and built.timeout_s == math.inf
    assert [e.path for e in errors] == ["x.lr"]
    errors.clear()
    build(Limits, {"timeout_s": float("nan")}, "x", errors)
    assert [e.reason for e in errors] == ["expected a number, not NaN"]


# ---- recipe files ---------------------------------------------------------------------------------
RECIPES: dict[str, tuple[bytes, str]] = {
    "bad_member": (b"# @package _global_\ndefaults:\n  - override /teacher: nosuch\n",
                   "defaults[0]: unknown teacher option (got 'nosuch')"),
    "bad_group": (b"# @package _global_\ndefaults:\n  - override /nosuch: x\n", "defaults[0]: unknown config group"),
    "bad_entry": (b"# @package _global_\ndefaults:\n  - 42\n", "defaults[0]: not a defaults entry (got 42)"),
    "defaults_not_list": (b"# @package _global_\ndefaults: 7\n", "defaults: must be a list (got 7)"),
    "no_override": (b"# @package _global_\ndefaults:\n  - /teacher: server\n",
                    "defaults[0]: the primary config already picks this group"),
    "tabs": (b"# @package _global_\ntrainer:\n\tmax_steps: 3\n", "not valid YAML at line 3, column 1"),
    "malformed": (b"# @package _global_\ntrainer: [1, 2\n", "not valid YAML at line 3"),
    "binary": (b"# @package _global_\nrun:\n  name: \xff\xfe\x00\x01\n", "not UTF-8 text (byte 33)"),
    "nul": (b"# @package _global_\nrun:\n  name: a\x00b\n", "binary data (a NUL byte)"),
    "huge_int": (b"# @package _global_\ntrainer:\n  max_steps: " + b"9" * 6000 + b"\n", "cannot read the YAML"),
    "deep": (b"# @package _global_\nrollout:\n  sglang_args: " + nested(200).encode() + b"\n",
             "values nest deeper than 32 levels"),
    "other_package": (b"# @package foo\ntrainer: {}\n", "recipes are `# @package _global_` files"),
    "not_a_mapping": (b"- 1\n- 2\n", "not a recipe"),
    "unknown_keys": (b"x: 1\n", "not a recipe"),
    "empty_without_directive": (b"", "not a recipe"),
    "unknown_section": (b"# @package _global_\ntrainr:\n  max_steps: 3\n", "trainr: unknown config section"),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_broken_recipe_file_is_named(tmp_path, name):
    content, expected = RECIPES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    msgs = errors_of([f"+recipe={path}"])
    assert any(m.startswith(f"recipe {path}") and expected in m for m in msgs), msgs


@pytest.mark.parametrize(("content", "key"), [
    (b"# @package _global_\nrun:\n  name: ${oc.env:SLIMECLI_TEST_SURELY_UNSET}\n", "run.name"),
    (b"# @package _global_\nrun:\n  name: ${no.such.key}\n", "run.name"),
])
def test_an_unresolvable_recipe_value_names_the_key_and_the_file(tmp_path, content, key):
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    msgs = errors_of([f"+recipe={path}"])
    assert len(msgs) == 1 and msgs[0].startswith(f"{key}: cannot resolve") and str(path) in msgs[0], msgs


def test_etc_passwd_is_not_a_recipe():
    if not Path("/etc/passwd").is_file():
        pytest.skip("no /etc/passwd here")
    msgs = errors_of(["+recipe=/etc/passwd"])
    assert len(msgs) == 1 and msgs[0].startswith("recipe /etc/passwd: not a recipe"), msgs


def test_a_recipe_without_the_directive_but_with_known_sections_is_global(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("defaults:\n  - override /optimizer: stateless_adam\ntrainer:\n  max_steps: 5\n")
    cfg = load([f"+recipe={path}"])
    assert (cfg.recipe, cfg.trainer.max_steps, cfg.optimizer.name) == ("mine", 5, "stateless_adam")


def test_recipes_list_survives_a_binary_file_in_a_recipe_dir(tmp_path):
    (tmp_path / "junk.yaml").write_bytes(b"\xff\xfe\x00garbage")
    out = invoke_cli("recipes", "list", "--recipe-dir", str(tmp_path))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


# ---- the frozen run config ------------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    b"trainer:\n  max_steps: " + b"9" * 6000 + b"\n",
    b"rollout:\n  sglang_args: " + nested(3000).encode() + b"\n",
    b"\xff\xfe\x00\x01",
    b"trainer: [1, 2\n",
])
def test_a_damaged_frozen_config_is_a_config_error(tmp_path, content):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigErrors) as info:
        load_frozen(path)
    assert str(path) in info.value.render()


# ---- as a user sees it ----------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["optimizer.lr=" + "9" * 6000],
    ["optimizer.lr=1e999"],
    ["optimizer.lr=" + nested(3000)],
    ["+recipe=/etc/passwd"],
])
def test_the_cli_exits_2_without_a_traceback(args):
    out = invoke_cli("config", "validate", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "config error" in out.stderr
