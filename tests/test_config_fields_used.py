"""Every config key does something: each field of the schema is read somewhere in slimecli outside the schema
and the validation rules. A knob nobody reads is either wired where it applies or removed.

The scan is static (ast) and typed by the schema: a read of `rollout.port` is `<x>.port` where `<x>` is
`<...>.rollout`, a name assigned from one (`r = cfg.rollout`), or a name annotated `RolloutConfig`;
`getattr(<x>, "port")` counts too, and `getattr(<x>, name)` counts every string constant of that module that
names a field of the group (`for k in ("tp", "dp"): getattr(t, k)`).
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from functools import cache
from pathlib import Path

import pytest

from slimecli.config.schema import SlimeConfig

PKG = Path(__file__).resolve().parent.parent / "slimecli"
# Where fields are defined or only validated: a read there is not a use.
NOT_USES = (PKG / "config" / "schema.py", PKG / "config" / "groups", PKG / "config" / "rules")

# Fields with no reader in slimecli on purpose, each with the reason. Keep this short.
ALLOWED_UNREAD: dict[str, str] = {
    # the deprecated spelling of trainer.off_policy_correction=tis: rewritten where the config enters
    # (config/canonical.py), so only the config layer reads it
    "trainer.use_tis": "rewritten into trainer.off_policy_correction=tis when the config is composed",
}


@cache
def hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def dataclass_of(tp: typing.Any) -> type | None:
    """The dataclass in a field's type (`X`, `X | None`), else None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        found = dataclass_of(arg)
        if found is not None:
            return found
    return None


def schema_fields(cls: type = SlimeConfig, prefix: str = "") -> list[tuple[str, type, str]]:
    """(dotted path, owning dataclass, field name) of every leaf field, recursively."""
    out: list[tuple[str, type, str]] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        sub = dataclass_of(hints(cls)[f.name])
        if sub is not None:
            out += schema_fields(sub, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", cls, f.name))
    return out


def dataclasses_by_attr() -> dict[str, type]:
    """Attribute name -> the dataclass it holds, for every dataclass-valued field of the schema."""
    found: dict[str, type] = {}

    def walk(cls: type) -> None:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            sub = dataclass_of(hints(cls)[f.name])
            if sub is not None:
                found.setdefault(f.name, sub)  # the outermost holder of a name (reward: RewardConfig, not eval's)
                walk(sub)

    walk(SlimeConfig)
    return found


class Reads(ast.NodeVisitor):
    """The (dataclass, field) pairs one module reads.

    Aliases are per module and a name may stand for several dataclasses (`cfg` is a SlimeConfig here and a
    TrainerConfig there): a read through it counts for each, which errs towards "read", never towards a false
    alarm.
    """

    def __init__(self, tree: ast.Module, by_attr: dict[str, type],
                 shared: dict[str, set[type]] | None = None) -> None:
        """`shared`: attribute aliases of other modules (`self.settings` set in a base class)."""
        self.by_attr = by_attr
        self.by_name = {cls.__name__: cls for cls in [SlimeConfig, *by_attr.values()]}
        self.aliases: dict[str, set[type]] = {k: set(v) for k, v in (shared or {}).items()}
        self.reads: set[tuple[type, str]] = set()
        self.dynamic: set[type] = set()  # getattr(<group>, <not a constant>)
        self.strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        nodes = list(ast.walk(tree))
        for _ in range(3):  # aliases of aliases (`s = self.settings`), wherever they are defined
            for node in nodes:
                self._collect_alias(node)
        self.visit(tree)
        for cls in self.dynamic:
            self.reads |= {(cls, s) for s in self.strings if s in {f.name for f in dataclasses.fields(cls)}}  # type: ignore[arg-type]

    def _annotated(self, annotation: ast.expr | None) -> set[type]:
        if annotation is None:
            return set()
        words = ast.unparse(annotation).replace('"', " ").replace("'", " ").replace("|", " ").replace(".", " ")
        return {cls for name, cls in self.by_name.items() if name in words.split()}

    def _alias(self, target: ast.expr, types: set[type]) -> None:
        if types:
            self.aliases.setdefault(ast.unparse(target), set()).update(types)

    def _collect_alias(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                self._alias(ast.Name(a.arg), self._annotated(a.annotation))
        elif isinstance(node, ast.AnnAssign):
            self._alias(node.target, self._annotated(node.annotation) | (self.types_of(node.value) if node.value
                                                                          else set()))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts, strict=False):
                        self._alias(t, self.types_of(v))
                else:
                    self._alias(target, self.types_of(node.value))

    def types_of(self, expr: ast.expr) -> set[type]:
        """The schema dataclasses an expression may hold, as far as a static look can tell."""
        found = set(self.aliases.get(ast.unparse(expr), ()))
        if isinstance(expr, ast.Attribute):
            for owner in self.types_of(expr.value):
                sub = dataclass_of(hints(owner).get(expr.attr))
                if sub is not None:
                    found.add(sub)
            if expr.attr in self.by_attr:
                found.add(self.by_attr[expr.attr])
        elif isinstance(expr, ast.BoolOp):  # settings or SandboxConfig(...)
            for value in expr.values:
                found |= self.types_of(value)
        elif isinstance(expr, ast.IfExp):
            found |= self.types_of(expr.body) | self.types_of(expr.orelse)
        elif isinstance(expr, ast.Call):  # SandboxConfig(...), replace(cfg.rollout, ...)
            func = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", "")
            if func in self.by_name:
                found.add(self.by_name[func])
            elif func == "replace" and expr.args:
                found |= self.types_of(expr.args[0])
        return found

    def attribute_aliases(self) -> dict[str, set[type]]:
        return {k: v for k, v in self.aliases.items() if "." in k}

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owners = self.types_of(node.value)
        self.reads |= {(owner, node.attr) for owner in owners}
        if not owners and node.attr in {f.name for f in dataclasses.fields(SlimeConfig)}:
            self.reads.add((SlimeConfig, node.attr))  # top-level keys (cfg.recipe) on whatever holds the config
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
            key = node.args[1]
            for owner in self.types_of(node.args[0]):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    self.reads.add((owner, key.value))
                else:
                    self.dynamic.add(owner)
        self.generic_visit(node)


def all_reads() -> set[tuple[type, str]]:
    by_attr = dataclasses_by_attr()
    trees = [ast.parse(path.read_text(), str(path)) for path in sorted(PKG.rglob("*.py"))
             if not any(path == p or p in path.parents for p in NOT_USES)]
    shared: dict[str, set[type]] = {}
    for tree in trees:
        for key, types in Reads(tree, by_attr).attribute_aliases().items():
            shared.setdefault(key, set()).update(types)
    reads: set[tuple[type, str]] = set()
    for tree in trees:
        reads |= Reads(tree, by_attr, shared).reads
    return reads


def definer(cls: type, name: str) -> type:
    """The class whose body declares a field: the shared base of two groups that hold the same settings
    (teacher and each teachers entry share TeacherSettings'), where a read through either reads the setting."""
    return next((c for c in cls.__mro__ if name in vars(c).get("__annotations__", {})), cls)


def test_every_schema_field_is_read_somewhere() -> None:
    reads = all_reads()
    read_fields = {(definer(cls, name), name) for cls, name in reads if dataclasses.is_dataclass(cls)}
    unread = [key for key, cls, name in schema_fields()
              if (cls, name) not in reads and (definer(cls, name), name) not in read_fields
              and key not in ALLOWED_UNREAD]
    assert not unread, ("config fields that nothing in slimecli reads (outside the schema and the rules): wire "
                        "them where they apply or remove them: " + ", ".join(unread))


def test_allow_list_names_real_unread_fields() -> None:
    """An allowed entry that is gone from the schema, or is read after all, leaves the list."""
    keys = {key: (cls, name) for key, cls, name in schema_fields()}
    reads = all_reads()
    assert set(ALLOWED_UNREAD) <= set(keys), set(ALLOWED_UNREAD) - set(keys)
    assert not [k for k in ALLOWED_UNREAD if keys[k] in reads]
    assert all(reason.strip() for reason in ALLOWED_UNREAD.values())


def test_the_scan_sees_through_aliases_and_getattr() -> None:
    """The scanner itself: the read forms slimecli uses are found, a field of another group is not."""
    from slimecli.config.groups.rollout import RolloutConfig
    from slimecli.config.groups.teacher import TeacherConfig

    src = (
        "def f(cfg, rc: RolloutConfig):\n"
        "    r, t = cfg.rollout, cfg.teacher\n"
        "    a = r.port + rc.max_new_tokens + cfg.rollout.host\n"
        "    b = getattr(t, 'tp')\n"
        "    for k in ('dp', 'nope'):\n"
        "        getattr(t, k)\n"
        "    return cfg.agent.request_timeout_s\n"
    )
    reads = Reads(ast.parse(src), dataclasses_by_attr()).reads
    assert {(RolloutConfig, "port"), (RolloutConfig, "max_new_tokens"), (RolloutConfig, "host"),
            (TeacherConfig, "tp"), (TeacherConfig, "dp")} <= reads
    assert (RolloutConfig, "request_timeout_s") not in reads and (TeacherConfig, "port") not in reads


# ---- knobs the audit wired where they apply -----------------------------------------------------------------
def test_task_on_invalid_applies_where_tasks_are_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """task.on_invalid: the rules refuse a file with bad rows before launch; the prompt source that reads the file
    in the trainer honours the key too (a file changed since, or a config built without the rules)."""
    from slimecli.config.groups.task import TaskConfig
    from slimecli.rollout.data import PromptSource
    from slimecli.swe.task import resolve_path

    good = resolve_path("builtin:swe_tiny").read_text().splitlines()[0]
    path = tmp_path / "tasks.jsonl"
    path.write_text(good + "\n{}\n")
    with pytest.raises(ValueError, match=r"1 bad task row\(s\).*task.on_invalid=error"):
        PromptSource(TaskConfig(name="swe", path=str(path), on_invalid="error"), seed=0)
    with caplog.at_level("WARNING", logger="slimecli.rollout"):
        source = PromptSource(TaskConfig(name="swe", path=str(path), on_invalid="skip"), seed=0)
    assert len(source.next(2)) == 2 and "1 bad task row(s) skipped (task.on_invalid=skip)" in caplog.text


def test_trust_remote_code_reaches_sglang_engines(tmp_path: Path) -> None:
    from slimecli.config.compose import load
    from slimecli.launch.plan import engine_specs

    cfg = load(["rollout=sglang", "rollout.port=30000"])  # a picked port, as launch writes it
    assert "--trust-remote-code" not in engine_specs(cfg, "c.yaml")[0].argv
    trusting = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, trust_remote_code=True))
    assert "--trust-remote-code" in engine_specs(trusting, "c.yaml")[0].argv
