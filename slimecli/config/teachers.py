"""A run's teachers as one list: the `teachers` entries, or the `teacher` group's one teacher (a list of one,
named "default"), and which of them scores a sample: teacher_routes by the sample's source label
(env.mix[].name, or a data row's `source`), else teacher_default, else the first.

Every part that serves, checks or asks a teacher takes one teacher's settings as a `teacher` group
(TeacherConfig), so a process or check of one teacher reads ``teacher_view(cfg, t)``: the run's config with
that teacher in the `teacher` group. Pure: no files, no network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from slimecli.config.errors import ConfigError
from slimecli.config.groups.teacher import TeacherConfig, TeacherEntry, TeacherSettings
from slimecli.config.layout import MULTI_NODE_PORTS
from slimecli.config.port import is_auto
from slimecli.config.schema import SlimeConfig

KEY = re.compile(r"(?<![\w.])teacher\.(?=[a-z_])")  # teacher.port in a path or message, not "the teacher."
SINGLE = "default"  # the name of the `teacher` group's one teacher (its metrics: teacher/default/...)
GROUP_PROCESS = "teacher"  # its plan entry, as before there were several


@dataclass(frozen=True)
class RunTeacher:
    name: str
    index: int  # its place in the list (a multi-node run's agreed ports count up by it)
    settings: TeacherConfig  # as the `teacher` group would hold it: `name` is its kind (server | sglang)
    opd_kl_coef: float  # its own, or trainer.opd_kl_coef
    key: str  # where its fields are in the config: "teacher" or "teachers[i]" (error messages)

    @property
    def process(self) -> str:
        """Its plan entry (and log file): "teacher" for the `teacher` group's, teacher-<name> in a list."""
        return GROUP_PROCESS if self.key == "teacher" else f"teacher-{self.name}"

    @property
    def kind_text(self) -> str:
        """How the config says what it is: teacher=server, teachers[1].kind=sglang."""
        return f"teacher={self.settings.name}" if self.key == "teacher" else f"{self.key}.kind={self.settings.name}"


def run_teachers(cfg: SlimeConfig) -> list[RunTeacher]:
    """Every teacher of the run, in order: the `teachers` list, else the `teacher` group's one (none: [])."""
    if cfg.teachers:
        return [_listed(cfg, i, entry) for i, entry in enumerate(cfg.teachers)]
    if cfg.teacher.name == "none":
        return []
    return [RunTeacher(SINGLE, 0, cfg.teacher, cfg.trainer.opd_kl_coef, "teacher")]


def _listed(cfg: SlimeConfig, index: int, entry: TeacherEntry) -> RunTeacher:
    coef = cfg.trainer.opd_kl_coef if entry.opd_kl_coef is None else entry.opd_kl_coef
    return RunTeacher(entry.name, index, entry_settings(entry), coef, f"teachers[{index}]")


def entry_settings(entry: TeacherEntry) -> TeacherConfig:
    """A listed teacher as the `teacher` group would hold it (its kind as the member): what servers, clients and
    checks of one teacher take."""
    shared = {f.name: getattr(entry, f.name) for f in fields(TeacherSettings) if f.name != "name"}
    return TeacherConfig(name=entry.kind, **shared)


def find_teacher(cfg: SlimeConfig, name: str) -> RunTeacher:
    for t in run_teachers(cfg):
        if t.name == name:
            return t
    raise KeyError(f"no teacher named {name!r} (teachers: {', '.join(t.name for t in run_teachers(cfg)) or 'none'})")


def default_teacher(cfg: SlimeConfig) -> str:
    """The teacher of samples no route names: teacher_default, else the first teacher."""
    teachers = run_teachers(cfg)
    return cfg.teacher_default or (teachers[0].name if teachers else SINGLE)


def route(cfg: SlimeConfig, source: object) -> str:
    """The name of the teacher that scores a sample of source label ``source`` (None: a sample without one)."""
    if isinstance(source, str) and source in cfg.teacher_routes:
        return cfg.teacher_routes[source]
    return default_teacher(cfg)


def teacher_view(cfg: SlimeConfig, teacher: RunTeacher) -> SlimeConfig:
    """The run's config as one teacher's process and checks read it: that teacher in the `teacher` group.

    On a multi-node run "auto" is an agreed port (config/layout.py): teacher i's block of ports (one per node
    with every_node) starts nnodes x i past the agreed base, so teachers never share one."""
    settings = teacher.settings
    if teacher.index and is_auto(settings.port) and cfg.cluster.nnodes > 1:
        settings = replace(settings, port=MULTI_NODE_PORTS["teacher.port"] + teacher.index * cfg.cluster.nnodes)
    return cfg if settings is cfg.teacher else replace(cfg, teacher=settings)


def with_teacher_settings(cfg: SlimeConfig, teacher: RunTeacher, settings: TeacherConfig) -> SlimeConfig:
    """``cfg`` with one teacher's settings replaced (a port picked at launch), wherever they live."""
    if teacher.key == "teacher":
        return replace(cfg, teacher=settings)
    entries = list(cfg.teachers)
    shared = {f.name: getattr(settings, f.name) for f in fields(TeacherSettings) if f.name != "name"}
    entries[teacher.index] = replace(entries[teacher.index], **shared)
    return replace(cfg, teachers=tuple(entries))


def scoped(errors: list[ConfigError], teacher: RunTeacher) -> list[ConfigError]:
    """A check of one teacher's view (its settings in the `teacher` group) reported under its own key:
    teachers[1].port, not teacher.port."""
    if teacher.key == "teacher":
        return errors
    def under(text: str) -> str:
        return KEY.sub(teacher.key + ".", text)

    return [replace(e, path=under(e.path), reason=under(e.reason), hint=under(e.hint)) for e in errors]
