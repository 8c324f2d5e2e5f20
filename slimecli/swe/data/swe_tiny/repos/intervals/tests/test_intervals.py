import pytest

from intervals import Interval, covering, merge, parse, total_length


def test_reversed_bounds_are_rejected():
    with pytest.raises(ValueError, match="above"):
        Interval(3, 1)


def test_length():
    assert Interval(2, 7).length == 5
    assert Interval(4, 4).length == 0


def test_membership_inside_and_outside():
    assert 3 in Interval(1, 5)
    assert 1 in Interval(1, 5)
    assert 7 not in Interval(1, 5)
    assert 0 not in Interval(1, 5)


def test_overlaps():
    assert Interval(1, 5).overlaps(Interval(4, 9))
    assert Interval(1, 5).overlaps(Interval(5, 9))
    assert not Interval(1, 2).overlaps(Interval(3, 4))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(3, 4)) is None


def test_hull():
    assert Interval(1, 2).hull(Interval(6, 9)) == Interval(1, 9)


def test_merge_overlapping():
    assert merge([Interval(1, 3), Interval(2, 5)]) == [Interval(1, 5)]


def test_merge_keeps_disjoint_apart_and_sorts():
    assert merge([Interval(6, 8), Interval(1, 2), Interval(3, 4)]) == [Interval(1, 2), Interval(3, 4), Interval(6, 8)]


def test_merge_empty():
    assert merge([]) == []


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 4), Interval(2, 6), Interval(10, 11)]) == 7


def test_covering():
    spans = [Interval(0, 10), Interval(4, 6), Interval(8, 12)]
    assert covering(spans, 5) == [Interval(0, 10), Interval(4, 6)]


def test_parse():
    assert parse("[1, 5]") == Interval(1, 5)
    assert parse(" [ -2.5 , 3 ] ") == Interval(-2.5, 3)


def test_parse_rejects_garbage():
    with pytest.raises(ValueError, match="not an interval"):
        parse("1..5")


def test_str():
    assert str(Interval(1, 5)) == "[1, 5]"
