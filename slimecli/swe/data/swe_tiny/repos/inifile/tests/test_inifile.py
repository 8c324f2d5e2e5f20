import pytest

from inifile import ParseError, dumps, get_bool, get_int, get_list, parse

SAMPLE = """\
# global settings
name = demo

[server]
host = example.org
Port: 8080

; the database
[db]
path = /var/lib/demo.db
"""


def test_sections_and_keys():
    assert parse(SAMPLE) == {
        "": {"name": "demo"},
        "server": {"host": "example.org", "port": "8080"},
        "db": {"path": "/var/lib/demo.db"},
    }


def test_keys_are_case_insensitive_and_last_wins():
    assert parse("[a]\nKey = 1\nkey = 2\n") == {"a": {"key": "2"}}


def test_continuation_lines():
    assert parse("[a]\nmotd = hello\n  world\n") == {"a": {"motd": "hello\nworld"}}


def test_empty_value():
    assert parse("[a]\nk =\n") == {"a": {"k": ""}}


def test_bad_line_raises():
    with pytest.raises(ParseError, match="expected 'key = value'"):
        parse("[a]\njust words\n")


def test_unclosed_header_raises():
    with pytest.raises(ParseError, match="unclosed"):
        parse("[a\n")


def test_dumps_round_trip():
    data = {"": {"name": "demo"}, "server": {"host": "example.org", "port": "8080"}}
    assert parse(dumps(data)) == data


def test_dumps_layout():
    assert dumps({"a": {"x": "1"}, "b": {"y": "2"}}) == "[a]\nx = 1\n\n[b]\ny = 2\n"


def test_get_bool():
    assert get_bool("yes") is True
    assert get_bool(" off ") is False
    with pytest.raises(ValueError):
        get_bool("maybe")


def test_get_int():
    assert get_int("42") == 42
    assert get_int("0x1f") == 31


def test_get_list():
    assert get_list("a, b,,c ") == ["a", "b", "c"]
    assert get_list("x;y", sep=";") == ["x", "y"]
