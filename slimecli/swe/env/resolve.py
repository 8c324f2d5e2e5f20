"""The environment of one task, built when missing, and the sandboxes that run in it.

The agent's sandbox and the grader's get the same environment: its bin directory first on PATH and the venv
mounted read-only, so `python`, `pytest` and the repository's dependencies are the same for both. A task whose
environment cannot be had is `unevaluatable:env:<why>` (never a crash, never a 0), with the build log's path.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.config.groups.task import TaskConfig
from slimecli.swe.env.spec import EnvSpec, Plan, SpecError, host_has_runner, plan, runner_spec
from slimecli.swe.env.store import BuildFailed, Store, root_of
from slimecli.swe.task import SweTask

if TYPE_CHECKING:
    from slimecli.sandbox.base import Sandbox

CONTAINERS = ("docker", "podman")


class EnvUnavailable(Exception):
    """No environment for this task: `reason` is one word (install, venv, disk, checkout, image, spec, ...)."""

    def __init__(self, instance_id: str, reason: str, detail: str, log: Path | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.instance_id = instance_id
        self.reason = reason
        self.detail = detail
        self.log = log


@dataclass(frozen=True)
class TaskEnv:
    kind: str  # host | venv | image
    why: str  # how it was chosen
    bin_dir: str | None = None  # first on PATH in the agent's and the grader's sandbox
    ro_paths: tuple[str, ...] = ()  # shown read-only to both
    image: str | None = None  # kind image: the container image
    key: str | None = None  # a built environment's cache key

    @property
    def path_dirs(self) -> tuple[str, ...]:
        return (self.bin_dir,) if self.bin_dir else ()


_stores: dict[Path, Store] = {}
_stores_lock = threading.Lock()


def store_for(settings: TaskConfig) -> Store:
    """One Store per cache root per process, so that a failed build is remembered across tasks."""
    root = root_of(settings.env_dir).resolve()
    with _stores_lock:
        return _stores.setdefault(root, Store(root))


def plan_task(task: SweTask, settings: TaskConfig, sandbox: SandboxConfig) -> Plan:
    """What `task` gets under task.environment, without building anything. EnvUnavailable when that cannot be read."""
    from slimecli.swe.workspace import WorkspaceError

    try:
        chosen = plan(task, settings.environment, settings.env_installer, sandbox.name in CONTAINERS)
    except WorkspaceError as exc:
        raise EnvUnavailable(task.instance_id, "checkout", str(exc)) from None
    except SpecError as exc:
        raise EnvUnavailable(task.instance_id, "spec", str(exc)) from None
    if chosen.kind == "image":
        if not task.image:
            raise EnvUnavailable(task.instance_id, "image", "task.environment=image but the row names no image")
        if sandbox.name not in CONTAINERS:
            raise EnvUnavailable(task.instance_id, "image", f"the row's image {task.image} runs in a container "
                                 f"sandbox; sandbox={sandbox.name} (use sandbox=podman or sandbox=docker)")
    return chosen


def host_spec(settings: TaskConfig) -> EnvSpec | None:
    """The runner venv host tasks use when slimecli's interpreter cannot run pytest (a plain install); else None."""
    return None if host_has_runner() else runner_spec(settings.env_installer)


def _build(store: Store, task: SweTask, spec: EnvSpec, commit: str, retry: bool) -> Path:
    from slimecli.swe.env.build import build_venv

    try:
        store.ensure(spec.key(), lambda venv, log: build_venv(spec, task, commit, venv, log), retry=retry)
    except BuildFailed as exc:
        raise EnvUnavailable(task.instance_id, exc.reason, exc.detail, exc.log) from None
    return store.path(spec.key())


_images: dict[tuple[str, str, str], str | None] = {}


def _check_image(task: SweTask, sandbox: SandboxConfig) -> None:
    """The runtime answers and the row's image is there (or pulled): once per (runtime, image) per process."""
    from slimecli.sandbox.container import image_missing, runtime_missing

    assert task.image is not None  # plan_task refused an image environment without one
    key = (sandbox.name, sandbox.binary or "", task.image)
    if key not in _images:
        runtime = runtime_missing(sandbox.name, sandbox.binary)
        _images[key] = (f"sandbox={sandbox.name}: {runtime}" if runtime
                        else image_missing(sandbox.name, task.image, sandbox.binary))
    if _images[key] is not None:
        raise EnvUnavailable(task.instance_id, "image", f"field image: {_images[key]}")


def resolve(task: SweTask, settings: TaskConfig, sandbox: SandboxConfig, *, retry: bool = False) -> TaskEnv:
    """The environment of `task`, built (once per key, whoever asks first) when missing. EnvUnavailable."""
    chosen = plan_task(task, settings, sandbox)
    if chosen.kind == "image":
        _check_image(task, sandbox)
        return TaskEnv("image", chosen.why, image=task.image)
    spec = chosen.spec if chosen.kind == "venv" else host_spec(settings)
    if spec is None:  # host, and slimecli's own interpreter has the runner
        return TaskEnv("host", chosen.why, bin_dir=str(Path(sys.executable).parent))
    venv = _build(store_for(settings), task, spec, chosen.commit, retry)
    return TaskEnv(chosen.kind, chosen.why, bin_dir=str(venv / "bin"), ro_paths=(str(venv),), key=spec.key())


def grader_sandboxes(env: TaskEnv, settings: SandboxConfig) -> Callable[[Path], Sandbox]:
    """Fresh sandboxes for grading in `env`: no ports, the workspace, and the environment's interpreter first."""
    from slimecli.sandbox.factory import grader_factory

    return grader_factory(settings, path_dirs=env.path_dirs, ro_paths=env.ro_paths, image=env.image)


def unevaluatable_reason(exc: EnvUnavailable) -> str:
    """How a sample or a check records it: unevaluatable:env:<reason>."""
    return f"unevaluatable:env:{exc.reason}"


def describe(exc: EnvUnavailable) -> str:
    log = f" (build log: {exc.log})" if exc.log and os.path.exists(exc.log) else ""
    return f"{exc.detail}{log}"


def grading_sandboxes(task: SweTask, settings: TaskConfig, sandbox: SandboxConfig) -> Callable[[Path], Sandbox]:
    """The task's environment (built when missing) as grading sandboxes; Unevaluatable("env:<why>") when none."""
    from slimecli.swe.grade import Unevaluatable

    try:
        env = resolve(task, settings, sandbox)
    except EnvUnavailable as exc:
        raise Unevaluatable(f"env:{exc.reason}", describe(exc)) from None
    return grader_sandboxes(env, sandbox)
