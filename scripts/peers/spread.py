"""How much a figure moves from one measurement to the next, and how far two move together:
`scripts/runs.py --spread` over runs, `compare_peers.py --interleave` over turns."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def relative(values: Sequence[float]) -> list[float]:
    """The values over the largest (all positive): neither a spread nor r changes, and no
    square of a figure a damaged file made huge overflows to inf."""
    top = max(values)
    return [v / top for v in values]


def variation(values: Sequence[float]) -> float:
    """The coefficient of variation, standard deviation over mean (two values or more)."""
    v = relative(values)
    return statistics.stdev(v) / statistics.mean(v)


def correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pearson's r of `a` and `b`; None where either does not move (r is undefined)."""
    if len(set(a)) == 1 or len(set(b)) == 1:
        return None
    return statistics.correlation(relative(a), relative(b))
