"""A small arithmetic expression evaluator.

Numbers, variables, the constants pi and e, the operators + - * / // % **, unary minus,
parentheses and a few functions: abs, min, max, round, sqrt.

>>> evaluate("2 * (x + 1)", {"x": 4})
10
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping

__all__ = ["CalcError", "evaluate", "free_variables", "tokenize"]

Number = int | float


class CalcError(ValueError):
    """A malformed expression, an unknown name, or an arithmetic error (division by zero, overflow)."""


BINARY: dict[str, Callable[[Number, Number], Number]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}
FUNCTIONS: dict[str, Callable[..., Number]] = {"abs": abs, "min": min, "max": max, "round": round, "sqrt": math.sqrt}
CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e}
OPERATORS = ("**", "//", "+", "-", "*", "/", "%", "(", ")", ",")


def _is_name(token: str) -> bool:
    return token[0].isalpha() or token[0] == "_"


def tokenize(text: str) -> list[str]:
    """Number, name and operator tokens, in order; whitespace only separates them."""
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        j = i
        if ch.isdigit() or ch == ".":
            while j < len(text) and (text[j].isdigit() or text[j] == "."):
                j += 1
        elif ch.isalpha() or ch == "_":
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
        else:
            op = next((op for op in OPERATORS if text.startswith(op, i)), None)
            if op is None:
                raise CalcError(f"unexpected character {ch!r} at position {i}")
            j = i + len(op)
        tokens.append(text[i:j])
        i = j
    return tokens


def _apply(op: str, left: Number, right: Number) -> Number:
    if op in ("/", "//", "%") and right == 0:
        raise CalcError("division by zero")
    try:
        return BINARY[op](left, right)
    except OverflowError:
        raise CalcError(f"result of {op!r} too large") from None


class _Parser:
    """Recursive descent over the tokens; each method parses one precedence level."""

    def __init__(self, tokens: list[str], variables: Mapping[str, Number]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.variables = variables

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise CalcError("unexpected end of expression")
        self.pos += 1
        return token

    def expect(self, token: str) -> None:
        got = self.take()
        if got != token:
            raise CalcError(f"expected {token!r}, got {got!r}")

    def expression(self) -> Number:
        """sum := term (('+' | '-') term)*"""
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = _apply(op, value, self.term())
        return value

    def term(self) -> Number:
        """term := unary (('*' | '/' | '//' | '%') unary)*"""
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op = self.take()
            value = _apply(op, value, self.unary())
        return value

    def unary(self) -> Number:
        """unary := ('-' | '+') unary | power"""
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> Number:
        """power := atom ['**' unary]: groups to the right, so 2 ** 3 ** 2 is 2 ** 9, and 2 ** -1 is 0.5."""
        base = self.atom()
        if self.peek() != "**":
            return base
        self.take()
        return _apply("**", base, self.unary())

    def atom(self) -> Number:
        token = self.take()
        if token == "(":
            value = self.expression()
            self.expect(")")
            return value
        if token[0].isdigit() or token[0] == ".":
            try:
                return float(token) if "." in token else int(token)
            except ValueError:
                raise CalcError(f"bad number {token!r}") from None
        if _is_name(token):
            if self.peek() == "(":
                return self.call(token)
            if token in self.variables:
                return self.variables[token]
            if token in CONSTANTS:
                return CONSTANTS[token]
            raise CalcError(f"unknown name {token!r}")
        raise CalcError(f"unexpected token {token!r}")

    def call(self, name: str) -> Number:
        if name not in FUNCTIONS:
            raise CalcError(f"unknown function {name!r}")
        self.expect("(")
        args: list[Number] = []
        if self.peek() != ")":
            args.append(self.expression())
            while self.peek() == ",":
                self.take()
                args.append(self.expression())
        self.expect(")")
        try:
            return FUNCTIONS[name](*args)
        except (TypeError, ValueError) as exc:
            raise CalcError(f"{name}(): {exc}") from None


def evaluate(text: str, variables: Mapping[str, Number] | None = None) -> Number:
    """The value of the expression; names are looked up in `variables`, then in the constants."""
    parser = _Parser(tokenize(text), variables or {})
    if parser.peek() is None:
        raise CalcError("empty expression")
    value = parser.expression()
    if parser.peek() is not None:
        raise CalcError(f"unexpected token {parser.peek()!r}")
    return value


def free_variables(text: str) -> set[str]:
    """The variable names an expression needs: every name that is neither called nor a constant."""
    tokens = tokenize(text)
    names: set[str] = set()
    for i, token in enumerate(tokens):
        called = i + 1 < len(tokens) and tokens[i + 1] == "("
        if _is_name(token) and not called and token not in CONSTANTS:
            names.add(token)
    return names
