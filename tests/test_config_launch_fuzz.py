"""What `config validate` accepts, launch can start: every numeric, port and run-directory field of the schema is
set to edge values (negative, 0, huge, past 64 bits, the wrong type) one at a time, and whenever the config
passes, what launch does with it at start-up does not crash: the plan builds, every port it names can be
handed to bind(), and the run directory can be created."""

from __future__ import annotations

import copy
import dataclasses
import errno
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from slimecli.config.compose import compose_dict
from slimecli.config.convert import build, schema_paths
from slimecli.config.decode import field_specs, field_types
from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.port import MAX_PORT, is_port_key
from slimecli.config.rules import check_all
from slimecli.config.schema import SlimeConfig
from slimecli.launch.free_ports import with_free_ports
from slimecli.launch.plan import build_plan
from slimecli.launch.rundir import create
from slimecli.launch.rundir_checks import run_dir_errors

EDGE_VALUES: list[Any] = [-1, 0, 1, 65535, 65536, 99999, 2**31, 2**63, -2**63 - 1, 1e308, -0.5, "abc", None, True,
                          [1]]


@pytest.fixture(scope="module")
def composed() -> dict[str, Any]:
    data, errors = compose_dict([])
    assert errors == []
    return data


def get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def with_value(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    *parents, leaf = path.split(".")
    node = out
    for part in parents:  # the composed dict holds what the YAML files set; the schema's defaults fill the rest
        node = node.setdefault(part, {})
    node[leaf] = value
    return out


def validated(data: dict[str, Any]) -> tuple[SlimeConfig | None, list[ConfigError]]:
    """The schema and every rule, as `config validate` runs them after composing."""
    errors: list[ConfigError] = []
    cfg = build(SlimeConfig, data, "", errors)
    if cfg is not None and not errors:
        errors = check_all(cfg)
    return (cfg if not errors else None), errors


def numeric_paths() -> list[str]:
    defaults = dataclasses.asdict(SlimeConfig())
    return [p for p in schema_paths(SlimeConfig)
            if is_port_key(p) or isinstance(get(defaults, p), (int, float)) and not isinstance(get(defaults, p), bool)]


def bindable(port: int) -> None:
    """bind() takes the port: it may be in use or privileged (OSError), never out of range (OverflowError)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno in (errno.EADDRINUSE, errno.EACCES), exc


PORT_FIELDS = sorted(p for p in schema_paths(SlimeConfig) if is_port_key(p))


def test_every_port_field_of_the_schema_is_range_checked() -> None:
    """A port field added to the schema without a bound in its spec fails here, naming it."""
    assert PORT_FIELDS == ["agent.port", "cluster.master_port", "reward.judge_port", "rollout.port", "teacher.port"]
    for path in PORT_FIELDS:
        cls: Any = SlimeConfig
        *groups, leaf = path.split(".")
        for group in groups:
            cls = field_types(cls)[group]
        fs = field_specs(cls)[leaf]
        assert fs.le == MAX_PORT and fs.ge in (0, 1), path


def test_numeric_fields_at_edge_values_either_fail_validation_or_launch(composed: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    paths = numeric_paths()
    assert len(paths) > 50 and "rollout.port" in paths and "trainer.max_steps" in paths
    accepted = refused = 0
    for path in paths:
        for value in EDGE_VALUES:
            try:
                cfg, errors = validated(with_value(composed, path, value))
            except Exception as exc:  # noqa: BLE001 - a rule that crashes is a traceback instead of a message
                pytest.fail(f"{path}={value!r}: validation raised {type(exc).__name__}: {exc}")
            if cfg is None:
                refused += 1
                continue
            try:
                launched = with_free_ports(cfg)  # "auto" ports picked, as launch does first
            except ConfigErrors:  # no block of that many free ports: refused with a message, not a crash
                refused += 1
                continue
            accepted += 1
            specs = build_plan(launched, tmp_path / "run")  # what launch builds next; raises nothing
            for spec in specs:
                for port in spec.ports:
                    assert 0 <= port <= MAX_PORT, (path, value, spec.name, port)
            if is_port_key(path):
                bindable(get(dataclasses.asdict(cfg), path))
    assert accepted and refused


@pytest.mark.parametrize("path", PORT_FIELDS)
@pytest.mark.parametrize("value", [-1, 65536, 99999, 2**40, "80", 1.5])
def test_an_out_of_range_port_is_refused_naming_the_field(composed: dict[str, Any], path: str, value: Any) -> None:
    cfg, errors = validated(with_value(composed, path, value))
    assert cfg is None and path in {e.path for e in errors}, errors


def test_ports_counted_up_from_a_base_stay_in_range(composed: dict[str, Any]) -> None:
    data = with_value(with_value(composed, "rollout.port", 65535), "rollout.num_engines", 2)
    cfg, errors = validated(data)
    assert cfg is None and [e.path for e in errors] == ["rollout.port"] and "65536" in errors[0].reason
    cfg, errors = validated(with_value(data, "rollout.port", 65534))
    assert cfg is not None
    assert [p for s in build_plan(cfg, "run") for p in s.ports] == [65534, 65535]


RUN_DIR_VALUES = ["", ".", "..", "runs/x", "/proc/foo", "/proc", "../../../../../../../../proc/x", "/sys/x", "/dev/null", "/dev/shm/x", "a\0b", "x" * 300,
                  "~", "FILE", "FILE/below", "DIR", "DIR/new/deeper", "/"]


@pytest.mark.parametrize("key", ["run.dir", "run.root", "run.name"])
@pytest.mark.parametrize("value", RUN_DIR_VALUES)
def test_a_run_directory_that_passes_validation_can_be_created(composed: dict[str, Any], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, key: str,
                                                               value: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("not a directory")
    (tmp_path / "DIR").mkdir()
    cfg, errors = validated(with_value(composed, key, value))
    assert cfg is not None, errors  # the rules leave paths to the machine check
    problems = run_dir_errors(cfg)
    if problems:
        assert problems[0].path in ("run.dir", "run.root", "run.name") and problems[0].path == key, problems
        return
    if value in ("/", "~") and key != "run.name":
        return  # writable for this user, but not where a test makes run directories
    made = create(cfg)
    assert made.is_dir()


@pytest.mark.parametrize(("key", "value", "says"), [
    ("run.dir", "/proc/foo", "is under /proc, a kernel file system"),
    ("run.dir", "/sys/kernel/x", "is under /sys"),
    ("run.root", "/dev/shm", "is under /dev"),
    ("run.dir", "FILE", "exists and is a file, not a directory"),
    ("run.root", "FILE/runs", "is a file, so no directory can be made under it"),
    ("run.name", "x" * 250, "cannot name a directory"),
    ("run.name", "/proc/mine", "parent /proc: is under /proc"),
    ("run.name", "../FILE/mine", "parent runs/../FILE: exists and is a file"),
])
def test_an_unusable_run_directory_is_named_with_why(composed: dict[str, Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, key: str, value: str,
                                                     says: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("not a directory")
    cfg, _ = validated(with_value(composed, key, value))
    assert cfg is not None
    (error,) = run_dir_errors(cfg)
    assert error.path == key and says in error.reason


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a directory without write permission")
def test_an_unwritable_parent_is_named(composed: dict[str, Any], tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    cfg, _ = validated(with_value(composed, "run.dir", str(locked / "run")))
    assert cfg is not None
    (error,) = run_dir_errors(cfg)
    assert error.path == "run.dir" and f"cannot create it: {locked} is not writable" in error.reason
