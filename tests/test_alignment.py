"""Attention as word alignment: pieces merged to words, strongest links, AER, sharpness."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.alignment import (
    alignment_scores,
    parse_links,
    sharpness,
    strongest_links,
    word_attention,
    word_of_piece,
)

SRC = ["▁a", "▁black", "▁c", "at", "</s>"]  # words: a, black, cat
TGT = ["▁un", "▁ch", "at", "▁noir", "</s>"]  # words: un, chat, noir


def test_pieces_are_grouped_into_words_and_eos_into_none():
    assert word_of_piece(SRC) == [0, 1, 2, 2, -1]
    assert word_of_piece(["▁", "«", "▁dog"]) == [0, 0, 1]  # a lone marker starts the word
    assert word_of_piece(["x", "y", "▁z"]) == [0, 0, 1]  # a first piece without the marker


def test_word_attention_sums_source_pieces_and_averages_target_pieces():
    attention = torch.tensor(
        [
            [0.7, 0.1, 0.1, 0.0, 0.1],  # un -> a
            [0.0, 0.1, 0.3, 0.5, 0.1],  # ch -> cat (0.8)
            [0.0, 0.3, 0.5, 0.1, 0.1],  # at -> cat (0.6)
            [0.0, 0.8, 0.1, 0.0, 0.1],  # noir -> black
            [0.2, 0.2, 0.2, 0.2, 0.2],  # EOS row: dropped
        ]
    )
    words = word_attention(attention, SRC, TGT)
    expected = torch.tensor(
        [
            [0.7, 0.1, 0.1],
            [0.0, 0.2, 0.7],  # the mean of the rows of "ch" and "at"
            [0.0, 0.8, 0.1],
        ]
    )
    torch.testing.assert_close(words, expected)
    assert strongest_links(words) == {(0, 0), (2, 1), (1, 2)}


def test_alignment_error_rate_follows_och_and_ney():
    sure = [parse_links("0-0 2-1")]
    possible = [parse_links("0-0 2-1 1-2 1-1")]
    # predicted: one sure link, one possible-only link, one wrong link
    predicted = [{(0, 0), (1, 1), (0, 2)}]
    scores = alignment_scores(predicted, sure, possible)
    assert scores.precision == pytest.approx(2 / 3)
    assert scores.recall == pytest.approx(1 / 2)
    assert scores.aer == pytest.approx(1 - (1 + 2) / (3 + 2))
    perfect = alignment_scores(sure, sure, possible)
    assert perfect.aer == 0.0 and perfect.precision == 1.0 and perfect.recall == 1.0


def test_sharpness_of_one_hot_and_flat_attention():
    one_hot = torch.eye(3)
    flat = torch.full((2, 4), 0.25)
    s = sharpness([one_hot, flat])
    assert s.max_share == pytest.approx((3 * 1.0 + 2 * 0.25) / 5)
    assert s.entropy == pytest.approx(2 * math.log(4) / 5, abs=1e-6)
    assert s.uniform_entropy == pytest.approx((3 * math.log(3) + 2 * math.log(4)) / 5)
