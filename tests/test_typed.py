"""nmt.typed.build on lists and mappings (a previous compare_peers run is read through it):
each item checked, a wrong one named by its path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from nmt import typed


@dataclass(frozen=True)
class _Row:
    rates: list[float] = field(default_factory=list)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)


def test_lists_and_mappings_are_checked_item_by_item():
    row, problems = typed.build(_Row, {"rates": [1, 2.5], "figures": {"greedy": {"s": "x"}}})
    assert problems == [] and row == _Row([1.0, 2.5], {"greedy": {"s": "x"}})


@pytest.mark.parametrize(
    "raw, problem",
    [
        ({"rates": 3}, "rates: expected a list of a number, got 3"),
        ({"rates": [1.0, "fast"]}, "rates[1]: expected a number, got 'fast'"),
        ({"figures": []}, "figures: expected a mapping to a mapping, got []"),
        ({"figures": {"greedy": 3}}, "figures.greedy: expected a mapping, got 3"),
    ],
)
def test_a_wrong_item_is_named_by_its_path(raw, problem):
    assert typed.build(_Row, raw)[1] == [problem]
