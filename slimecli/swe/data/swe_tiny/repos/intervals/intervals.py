"""Closed intervals of numbers: membership, overlap, intersection, merging, and the gaps between them.

>>> merge([Interval(5, 8), Interval(1, 3), Interval(2, 4)])
[Interval(lo=1, hi=4), Interval(lo=5, hi=8)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Interval", "covering", "gaps", "merge", "parse", "total_length"]

_TEXT = re.compile(r"^\s*\[\s*([^,\]]+?)\s*,\s*([^,\]]+?)\s*\]\s*$")


@dataclass(frozen=True, order=True)
class Interval:
    """The closed interval [lo, hi]: both ends belong to it, and lo == hi is a single point."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"lower bound {self.lo} is above upper bound {self.hi}")

    @property
    def length(self) -> float:
        return self.hi - self.lo

    def __contains__(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def __str__(self) -> str:
        return f"[{self.lo}, {self.hi}]"

    def overlaps(self, other: Interval) -> bool:
        """True when the two share at least one point; intervals that only touch at an end do."""
        return self.lo <= other.hi and other.lo <= self.hi

    def intersection(self, other: Interval) -> Interval | None:
        """The shared part, or None when there is none."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.lo, other.lo), min(self.hi, other.hi))

    def hull(self, other: Interval) -> Interval:
        """The smallest interval that contains both."""
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))


def parse(text: str) -> Interval:
    """'[lo, hi]' (numbers as Python writes them) -> Interval; ValueError for anything else."""
    match = _TEXT.match(text)
    if match is None:
        raise ValueError(f"not an interval: {text!r} (expected '[lo, hi]')")
    lo, hi = (float(part) if any(c in part for c in ".eE") else int(part) for part in match.groups())
    return Interval(lo, hi)


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the same points; overlapping or touching ones are joined."""
    merged: list[Interval] = []
    for current in sorted(intervals):
        if merged and current.lo <= merged[-1].hi:
            merged[-1] = Interval(merged[-1].lo, max(merged[-1].hi, current.hi))
        else:
            merged.append(current)
    return merged


def total_length(intervals: Iterable[Interval]) -> float:
    """The length of the union: points covered twice count once."""
    return sum(interval.length for interval in merge(intervals))


def covering(intervals: Iterable[Interval], x: float) -> list[Interval]:
    """The intervals that contain x, in the order given."""
    return [interval for interval in intervals if x in interval]


def gaps(intervals: Iterable[Interval]) -> list[Interval]:
    """The stretches between the merged intervals, in order; each gap runs from one's hi to the next one's lo."""
    merged = merge(intervals)
    return [Interval(left.hi, right.lo) for left, right in zip(merged, merged[1:])]
