"""Teacher rules: where each teacher comes from and where it runs (its limits are in its schema's field specs),
and, with several teachers, their names and the routes that pick one per sample (config/teachers.py)."""

from __future__ import annotations

import re

from slimecli.config.errors import ConfigError, allowed_hint
from slimecli.config.port import MAX_PORT
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import RunTeacher, run_teachers

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # it names a process, its log file and its metrics


def source(cfg: SlimeConfig) -> list[ConfigError]:
    return [e for t in run_teachers(cfg) for e in _source(t)]


def _source(teacher: RunTeacher) -> list[ConfigError]:
    t, key, kind = teacher.settings, teacher.key, teacher.kind_text
    if t.name == "server" and not (t.url or t.model_path):
        return [ConfigError(f"{key}.model_path", None, f"{kind} needs {key}.model_path (launched by slimecli) "
                            f"or {key}.url (an existing server)")]
    if t.name == "sglang" and not t.url:
        return [ConfigError(f"{key}.url", None, f"{kind} needs the URL of a running SGLang server")]
    if t.url and not t.url.startswith(("http://", "https://")):
        return [ConfigError(f"{key}.url", t.url, "must start with http:// or https://")]
    return []


def sglang_temperature(cfg: SlimeConfig) -> list[ConfigError]:
    """SGLang applies the temperature to sampled tokens only: its input-token log-probs, which teacher=sglang
    scores with, are always at temperature 1, and no reply holds the full distribution to rescale them."""
    temperature = cfg.rollout.temperature
    sglang = [t for t in run_teachers(cfg) if t.settings.name == "sglang"]
    if not sglang or temperature == 1.0:
        return []
    return [ConfigError("rollout.temperature", temperature,
                        f"{sglang[0].kind_text} scores at temperature 1 only (SGLang applies the temperature to "
                        "sampled tokens, not to the input-token log-probs the teacher's scores are), so it cannot "
                        "score the student's tokens at this rollout temperature",
                        "use teacher=server (it scores at the rollout temperature), or rollout.temperature=1.0")]


def placement(cfg: SlimeConfig) -> list[ConfigError]:
    errors = []
    for teacher in run_teachers(cfg):
        t, key = teacher.settings, teacher.key
        if t.every_node and (t.name != "server" or t.url):
            what = "teacher=server" if key == "teacher" else f"{key}.kind=server"
            errors.append(ConfigError(f"{key}.every_node", True, "starts a teacher server on every node: it needs "
                                      f"{what} with {key}.model_path, not a teacher that runs already ({key}.url)",
                                      f"drop {key}.url (and use {what}), or drop {key}.every_node"))
    return errors


def one_place(cfg: SlimeConfig) -> list[ConfigError]:
    """One teacher in the `teacher` group, or several in `teachers`: not both (which would score?). A group
    member with nothing of its own (teacher=server as +recipe=opd picks it) is no teacher: the list wins."""
    if cfg.teachers and (cfg.teacher.url or cfg.teacher.model_path):
        return [ConfigError("teacher", cfg.teacher.name, "the run has a `teachers` list: the teacher group's "
                            "teacher would be left out",
                            f"add it to teachers as {{name: NAME, kind: {cfg.teacher.name}, ...}}, or drop teacher.url and teacher.model_path")]
    return []


def names(cfg: SlimeConfig) -> list[ConfigError]:
    """Each listed teacher has its own name, one that can name its process, log file and metrics."""
    errors, seen = [], set()
    for i, entry in enumerate(cfg.teachers):
        key = f"teachers[{i}].name"
        if not entry.name:
            errors.append(ConfigError(key, None, "is required: routes, metrics (teacher/<name>/kl) and the "
                                      "teacher's process (teacher-<name>) name it"))
        elif not NAME.fullmatch(entry.name):
            errors.append(ConfigError(key, entry.name, "letters, digits, '_', '.' and '-' only, starting with a "
                                      "letter or digit (it names a process, a log file and metrics)"))
        elif entry.name in seen:
            errors.append(ConfigError(key, entry.name, "another teacher has this name"))
        seen.add(entry.name)
    return errors


def routes(cfg: SlimeConfig) -> list[ConfigError]:
    """Every route and teacher_default name a teacher of the run; with env.mix, every route names a source."""
    teachers = list(dict.fromkeys(t.name for t in run_teachers(cfg) if t.name))
    known = ", ".join(teachers) or "none"
    labels = [m.name for m in cfg.env.mix]
    errors = []
    for label, name in cfg.teacher_routes.items():
        key = f"teacher_routes.{label}"
        if not isinstance(label, str) or not label:
            errors.append(ConfigError("teacher_routes", label, "a route's key is a source's label (a string)"))
        elif labels and label not in labels:
            errors.append(ConfigError(key, name, "no source of env.mix has this label",
                                      allowed_hint(label, labels)))
        if not isinstance(name, str) or name not in teachers:
            errors.append(ConfigError(key, name, f"names no teacher of the run (teachers: {known})",
                                      allowed_hint(str(name), teachers) if teachers else
                                      "add the teachers list: teachers=[{name: NAME, ...}]"))
    if cfg.teacher_default is not None and cfg.teacher_default not in teachers:
        errors.append(ConfigError("teacher_default", cfg.teacher_default,
                                  f"names no teacher of the run (teachers: {known})",
                                  allowed_hint(cfg.teacher_default, teachers) if teachers else ""))
    return errors


def ports(cfg: SlimeConfig) -> list[ConfigError]:
    """Listed teachers launched on ports given by hand do not share one (node k's on port + k with every_node)."""
    taken: dict[tuple[str, int], str] = {}
    errors = []
    for t in run_teachers(cfg):
        s = t.settings
        if t.key == "teacher" or s.name != "server" or s.url or not isinstance(s.port, int):
            continue
        nodes = cfg.cluster.nnodes if s.every_node else 1
        if s.every_node and nodes > 1 and s.port + nodes - 1 > MAX_PORT:
            errors.append(ConfigError(f"{t.key}.port", s.port, f"node k's teacher listens on port + k: node "
                                      f"{nodes - 1}'s would listen on {s.port + nodes - 1}, past {MAX_PORT}"))
        for port in range(s.port, s.port + nodes):
            other = taken.setdefault((s.host, port), t.name)
            if other != t.name:
                errors.append(ConfigError(f"{t.key}.port", s.port, f"teacher {other} listens on {s.host}:{port} "
                                          "too", "give each teacher its own port, or leave them auto"))
                break
    return errors


RULES = [one_place, names, source, sglang_temperature, placement, routes, ports]
