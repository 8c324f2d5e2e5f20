"""A tiny INI reader and writer: [sections], `key = value` (or `key: value`) pairs, comments, typed getters.

>>> parse("[server]\\nport = 8080\\n")
{'server': {'port': '8080'}}
"""

from __future__ import annotations

__all__ = ["ParseError", "dumps", "get_bool", "get_int", "get_list", "parse"]

TRUE = frozenset({"1", "yes", "true", "on"})
FALSE = frozenset({"0", "no", "false", "off"})
COMMENT = ("#", ";")


class ParseError(ValueError):
    """A line that is not a section header, a key/value pair, a comment or a continuation."""

    def __init__(self, lineno: int, message: str) -> None:
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def _separator(line: str) -> int:
    """The index of the first '=' or ':' in the line, whichever comes first; -1 when there is neither."""
    positions = [i for i in (line.find("="), line.find(":")) if i >= 0]
    return min(positions) if positions else -1


def parse(text: str) -> dict[str, dict[str, str]]:
    """Sections in file order, each a dict of key -> value (both strings).

    Keys before the first section header belong to the section "". Keys are case-insensitive (stored
    lower-case) and a repeated key keeps its last value. An indented line continues the previous value
    (joined with a newline). Lines starting with # or ; are comments.
    """
    data: dict[str, dict[str, str]] = {}
    section = ""
    key: str | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(COMMENT):
            continue
        if raw[0].isspace() and key is not None:
            data[section][key] += "\n" + line
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, f"unclosed section header {line!r}")
            section = line[1:-1].strip()
            if not section:
                raise ParseError(lineno, "empty section name")
            data.setdefault(section, {})
            key = None
            continue
        sep = _separator(line)
        if sep < 0:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        key = line[:sep].strip().lower()
        if not key:
            raise ParseError(lineno, "empty key")
        data.setdefault(section, {})[key] = line[sep + 1 :].strip()
    return data


def dumps(data: dict[str, dict[str, str]]) -> str:
    """INI text that parse() reads back as the same dict; a multi-line value becomes continuation lines."""
    out: list[str] = []
    for section, items in data.items():
        if section:
            if out:
                out.append("")
            out.append(f"[{section}]")
        for key, value in items.items():
            first, *rest = str(value).split("\n")
            out.append(f"{key} = {first}")
            out.extend(f"    {line}" for line in rest)
    return "\n".join(out) + "\n" if out else ""


def get_bool(value: str) -> bool:
    """1/yes/true/on and 0/no/false/off, in any letter case."""
    word = value.strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r}")


def get_int(value: str) -> int:
    """A decimal integer, or hexadecimal / octal / binary with a 0x / 0o / 0b prefix."""
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise ValueError(f"not an integer: {value!r}") from None


def get_list(value: str, sep: str = ",") -> list[str]:
    """The non-empty items of a separated list, each stripped of surrounding whitespace."""
    return [item.strip() for item in value.split(sep) if item.strip()]
