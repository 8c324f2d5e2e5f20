"""Candidate bugs: one small edit of one line of a function, of the kinds SWE-smith's procedural injectors make.

An edit is a byte range of the file and its replacement, found from the AST's positions (UTF-8 byte columns),
so everything else in the file, its formatting and comments, stays exactly as it was and the gold patch is the
smallest diff that undoes it. Whether an edit still compiles is checked only when it is tried (`apply`).
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = ("flip_comparison", "off_by_one", "remove_statement", "remove_branch", "remove_condition",
         "swap_arguments", "wrong_operator", "drop_return_value")
# (the operator as a pattern that matches it alone, its replacement)
_FLIP = {ast.Lt: (r"(?<![<>=!])<(?![<=])", ">="), ast.Gt: (r"(?<![<>=-])>(?![>=])", "<="), ast.LtE: ("<=", ">"),
         ast.GtE: (">=", "<"), ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: (r"\bin\b", "not in"),
         ast.NotIn: (r"\bnot\s+in\b", "in"), ast.Is: (r"\bis\b", "is not"), ast.IsNot: (r"\bis\s+not\b", "is")}
_BINOP = {ast.Add: (r"(?<![+=])\+(?![+=])", "-"), ast.Sub: (r"(?<![-=])-(?![-=>])", "+"),
          ast.Mult: (r"(?<!\*)\*(?![*=])", "//"), ast.Div: (r"(?<!/)/(?![/=])", "*"), ast.FloorDiv: (r"//(?!=)", "*"),
          ast.Mod: (r"%(?!=)", "//")}
_AUG = {ast.Add: (r"\+=", "-="), ast.Sub: (r"-=", "+=")}
_REMOVABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.If, ast.Raise)


@dataclass(frozen=True)
class Mutation:
    path: str  # repository-relative
    function: str  # qualified name of the function it breaks
    line: int  # the line whose execution makes the bug matter (must be covered by a passing test)
    kind: str
    start: int  # byte offsets of the replaced range
    end: int
    new: bytes

    @property
    def key(self) -> str:
        """Stable for the same edit of the same file: names the task."""
        blob = f"{self.path}\0{self.kind}\0{self.start}\0{self.end}\0".encode() + self.new
        return hashlib.sha256(blob).hexdigest()[:10]

    def apply(self, source: bytes) -> bytes | None:
        """The broken file, or None when the edit does not compile or changes nothing."""
        mutated = source[:self.start] + self.new + source[self.end:]
        if mutated == source:
            return None
        try:
            compile(mutated, self.path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return None
        return mutated


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, source: bytes) -> None:
        self.path, self.source = path, source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.scope: list[str] = []
        self.in_function: list[bool] = [False]
        self.found: list[Mutation] = []

    # ---- positions -----------------------------------------------------------------------------------------
    def pos(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        n: ast.expr = node  # type: ignore[assignment]
        return self.pos(n.lineno, n.col_offset), self.pos(n.end_lineno or n.lineno, n.end_col_offset or 0)

    def text(self, node: ast.AST) -> bytes:
        a, b = self.span(node)
        return self.source[a:b]

    def whole_lines(self, first: ast.stmt, last: ast.stmt) -> tuple[int, int] | None:
        """The byte range of the lines `first`..`last` occupy, when nothing else shares those lines."""
        head = self.lines[first.lineno - 1][:first.col_offset]
        end_line = last.end_lineno or last.lineno
        tail = self.lines[end_line - 1][last.end_col_offset or 0:]
        if head.strip() or (tail.strip() and not tail.strip().startswith(b"#")):
            return None
        return self.starts[first.lineno - 1], self.starts[end_line]

    def add(self, node: ast.AST, kind: str, start: int, end: int, new: bytes, line: int | None = None) -> None:
        if self.scope:
            self.found.append(Mutation(self.path, ".".join(self.scope), line or node.lineno,  # type: ignore[attr-defined]
                                       kind, start, end, new))

    # ---- scopes --------------------------------------------------------------------------------------------
    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.in_function.append(not isinstance(node, ast.ClassDef))
        self._bodies(node.body)
        for child in node.body:
            self.visit(child)
        self.in_function.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped  # type: ignore[assignment]

    def generic_visit(self, node: ast.AST) -> None:
        if self.in_function[-1]:
            self._edits(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(node, ast.stmt) and isinstance(getattr(node, field, None), list):
                self._bodies(getattr(node, field))
        super().generic_visit(node)

    # ---- the edits -----------------------------------------------------------------------------------------
    def _bodies(self, body: list[ast.stmt]) -> None:
        """remove_statement: a statement of a body that keeps at least one other (never the docstring)."""
        if not self.in_function[-1] or len(body) < 2:
            return
        for i, stmt in enumerate(body):
            docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            if docstring or not isinstance(stmt, _REMOVABLE) or (isinstance(stmt, ast.If) and stmt.orelse):
                continue
            rng = self.whole_lines(stmt, stmt)
            if rng is not None:
                self.add(stmt, "remove_statement", rng[0], rng[1], b"")

    def _edits(self, node: ast.AST) -> None:
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            self._operator(node, node.left, node.comparators[0], _FLIP.get(type(node.ops[0])), "flip_comparison")
        elif isinstance(node, ast.BinOp) and not self._stringy(node):
            self._operator(node, node.left, node.right, _BINOP.get(type(node.op)), "wrong_operator")
        elif isinstance(node, ast.AugAssign):
            self._operator(node, node.target, node.value, _AUG.get(type(node.op)), "wrong_operator")
        elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
            a, _ = self.span(node)
            _, b = self.span(node.values[-2])
            self.add(node, "remove_condition", *self.span(node), self.source[a:b])
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.add(node, "remove_condition", *self.span(node), self.text(node.operand))
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, ast.Subscript):
            self._index(node)
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                self.add(node, "drop_return_value", *self.span(node), b"return")
        elif isinstance(node, ast.If) and node.orelse and not self._is_elif(node):
            self._else(node)

    @staticmethod
    def _stringy(node: ast.BinOp) -> bool:
        """String building (concatenation, %-formatting) is not arithmetic to break."""
        return any(isinstance(s, ast.JoinedStr) or (isinstance(s, ast.Constant) and isinstance(s.value, str | bytes))
                   for s in (node.left, node.right))

    def _operator(self, node: ast.AST, left: ast.AST, right: ast.AST, swap: tuple[str, str] | None, kind: str) -> None:
        """The one operator token between `left` and `right` (nothing else there matches it) replaced."""
        if swap is None:
            return
        _, a = self.span(left)
        b, _ = self.span(right)
        between = self.source[a:b].decode("utf-8", "replace")
        hits = list(re.finditer(swap[0], between))
        if len(hits) == 1 and "#" not in between:
            m = hits[0]
            start = a + len(between[:m.start()].encode())
            end = a + len(between[:m.end()].encode())
            self.add(node, kind, start, end, swap[1].encode())

    def _call(self, node: ast.Call) -> None:
        args = node.args
        if isinstance(node.func, ast.Name) and node.func.id == "range" and 1 <= len(args) <= 2 \
                and not any(isinstance(a, ast.Starred) for a in args):
            stop = args[-1]
            self.add(node, "off_by_one", *self.span(stop), self._shift(stop, -1))
        if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
            first, second = self.text(args[0]), self.text(args[1])
            if first != second:
                a, _ = self.span(args[0])
                mid_start, b = self.span(args[1])
                _, mid_end = self.span(args[0])
                self.add(node, "swap_arguments", a, b, second + self.source[mid_end:mid_start] + first)

    def _index(self, node: ast.Subscript) -> None:
        index = node.slice
        if isinstance(index, ast.Slice):
            for bound in (index.lower, index.upper):
                if bound is not None:
                    self.add(node, "off_by_one", *self.span(bound), self._shift(bound, 1))
                    return
        elif isinstance(index, ast.Constant) and isinstance(index.value, int) and not isinstance(index.value, bool):
            self.add(node, "off_by_one", *self.span(index), self._shift(index, 1))
        elif isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and isinstance(index.operand, ast.Constant):
            self.add(node, "off_by_one", *self.span(index), self._shift(index, -1))
        elif isinstance(index, ast.Name):
            self.add(node, "off_by_one", *self.span(index), self._shift(index, 1))

    def _shift(self, expr: ast.expr, by: int) -> bytes:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, int) and not isinstance(expr.value, bool):
            return str(expr.value + by).encode()
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.operand, ast.Constant) \
                and isinstance(expr.operand.value, int):
            return str(-expr.operand.value + by).encode()
        text = self.text(expr)
        if not isinstance(expr, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
            text = b"(" + text + b")"
        return text + (b" + 1" if by > 0 else b" - 1")

    def _is_elif(self, node: ast.If) -> bool:
        first = node.orelse[0]
        return isinstance(first, ast.If) and self.lines[first.lineno - 1].lstrip().startswith(b"elif")

    def _else(self, node: ast.If) -> None:
        """remove_branch: the `else:` line and its block."""
        last_body = node.body[-1].end_lineno or node.body[-1].lineno
        for number in range(last_body + 1, node.orelse[0].lineno + 1):
            stripped = self.lines[number - 1].strip()
            if stripped.startswith(b"else") and stripped.rstrip(b" ").endswith(b":") and \
                    stripped[4:].strip() == b":":
                rng = self.whole_lines(node.orelse[0], node.orelse[-1])
                if rng is not None:
                    self.add(node, "remove_branch", self.starts[number - 1], rng[1], b"", line=node.orelse[0].lineno)
                return


def find(path: str, source: bytes) -> list[Mutation]:
    """Every candidate edit of the functions in one file (none when the file does not parse)."""
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError):
        return []
    finder = _Finder(path, source)
    finder.visit(tree)
    unique = {(m.start, m.end, m.new): m for m in finder.found}
    return sorted(unique.values(), key=lambda m: (m.start, m.end, m.kind, m.new))


def covered(mutations: list[Mutation], lines: set[int]) -> Iterator[Mutation]:
    return (m for m in mutations if m.line in lines)
