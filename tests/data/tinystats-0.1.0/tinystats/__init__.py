"""A few statistics of small lists."""


def mean(values):
    """The arithmetic mean; ValueError for an empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    """The middle value (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def spread(values):
    """The largest value less the smallest."""
    return max(values) - min(values)


def clamp(value, low, high):
    """``value`` kept within [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
