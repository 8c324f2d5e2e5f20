import pytest

from wrap import center, fill, justify, wrap

TEXT = "the quick brown fox jumps over the lazy dog"


def test_wrap_greedy():
    assert wrap(TEXT, 13) == ["the quick", "brown fox", "jumps over", "the lazy dog"]


def test_wrap_wide_enough_is_one_line():
    assert wrap(TEXT, 80) == [TEXT]


def test_wrap_collapses_whitespace():
    assert wrap("  a \n\t b  ", 10) == ["a b"]


def test_wrap_empty():
    assert wrap("", 10) == []


def test_wrap_cuts_long_words():
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]


def test_wrap_rejects_zero_width():
    with pytest.raises(ValueError):
        wrap("a", 0)


def test_justify_even_spaces():
    assert justify("a b c", 7) == "a  b  c"


def test_justify_uneven_spaces():
    assert justify("aa b c", 9) == "aa   b  c"


def test_justify_single_word():
    assert justify("word", 6) == "word  "


def test_fill_paragraphs():
    assert fill("one two three\n\nfour five", 8) == "one two\nthree\n\nfour\nfive"


def test_center_even_padding():
    assert center("abc", 7) == "  abc  "
    assert center("ab", 6, "*") == "**ab**"


def test_center_line_longer_than_width():
    assert center("abcdef", 4) == "abcdef"
