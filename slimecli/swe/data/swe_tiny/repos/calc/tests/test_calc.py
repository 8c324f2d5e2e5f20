import math

import pytest

from calc import CalcError, evaluate, tokenize


def test_precedence():
    assert evaluate("1 + 2 * 3") == 7


def test_parentheses():
    assert evaluate("(1 + 2) * 3") == 9


def test_subtraction_groups_to_the_left():
    assert evaluate("10 - 3 - 2") == 5


def test_true_division():
    assert evaluate("7 / 2") == 3.5


def test_modulo():
    assert evaluate("7 % 3") == 1


def test_power():
    assert evaluate("2 ** 10") == 1024


def test_unary_minus():
    assert evaluate("-3 + 5") == 2
    assert evaluate("--2") == 2


def test_floats():
    assert evaluate("0.5 * 4") == 2.0
    assert evaluate(".25 + 1") == 1.25


def test_variables():
    assert evaluate("x * y + 1", {"x": 3, "y": 4}) == 13


def test_constants():
    assert evaluate("2 * pi") == pytest.approx(2 * math.pi)


def test_functions():
    assert evaluate("max(1, 5, 3)") == 5
    assert evaluate("abs(-2) + sqrt(16)") == 6


def test_division_by_zero():
    with pytest.raises(CalcError, match="division by zero"):
        evaluate("1 / 0")


def test_unknown_name():
    with pytest.raises(CalcError, match="unknown name 'y'"):
        evaluate("y + 1")


def test_unbalanced_parentheses():
    with pytest.raises(CalcError):
        evaluate("(1 + 2")


def test_empty_expression():
    with pytest.raises(CalcError, match="empty"):
        evaluate("   ")


def test_tokenize():
    assert tokenize("2*(x+1)") == ["2", "*", "(", "x", "+", "1", ")"]


def test_unexpected_character():
    with pytest.raises(CalcError, match="position 2"):
        evaluate("2 $ 3")
