"""Text on its way in and out of the model (`nmt.text`): pure functions, no model."""

from __future__ import annotations

import pytest

from nmt.text import clean_input, fill_unknowns
from nmt.tokenizer import UNK_MARK


@pytest.mark.parametrize(
    ("given", "lowercase", "expected"),
    [
        ("  Helga  ate\tan apple ", False, ("Helga ate an apple", False)),
        ("HELGA ATE AN APPLE!", False, ("Helga ate an apple!", True)),
        ("« HELGA ATE »", False, ("« Helga ate »", True)),
        ("I", False, ("I", False)),  # one capital letter is not shouting
        ("UN 3", False, ("Un 3", True)),
        ("王芳 ATE", False, ("王芳 ate", True)),  # letters without case do not count
        ("Helga Ate", True, ("helga ate", False)),
        ("HELGA", True, ("helga", False)),  # a lowercased model reads it as any other
        ("", False, ("", False)),
    ],
)
def test_clean_input(given, lowercase, expected):
    assert clean_input(given, lowercase=lowercase) == expected


def test_fill_unknowns_joins_a_piece_to_its_neighbours_as_in_the_source():
    surfaces = ["Z", "ü", "rich", " est", " belle"]
    assert fill_unknowns(f"Z{UNK_MARK}rich est belle", [1], surfaces) == "Zürich est belle"


def test_fill_unknowns_keeps_a_word_of_its_own_apart():
    surfaces = ["J", "'", "aime", " ", "🙂", " beaucoup"]
    assert fill_unknowns(f"J'aime{UNK_MARK}beaucoup", [4], surfaces) == "J'aime 🙂 beaucoup"
    assert fill_unknowns(f"{UNK_MARK} a mangé", [0], ["王芳", " ate"]) == "王芳 a mangé"


def test_fill_unknowns_leaves_the_text_when_the_counts_disagree():
    assert fill_unknowns(f"a  {UNK_MARK} b", [0, 1], ["x", "y"]) == f"a {UNK_MARK.strip()} b"
    assert fill_unknowns(f"a {UNK_MARK} b", [0], []) == f"a {UNK_MARK.strip()} b"
