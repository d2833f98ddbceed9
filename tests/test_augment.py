"""Invented names (`data.invented_names`): copies of training pairs with a name written the
same on both sides, the name replaced on both by a made-up one."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from test_data import EN, FR, corpus_config, quiet, write_split

from nmt.augment import invented_name, name_copies, shared_name
from nmt.data import prepare
from nmt.tokenizer import Tokenizer

SRC = [
    "Tom ate an apple.",
    "The dog sleeps.",
    "Tom told Mary about Boston.",
    "Tom saw Tom.",
    "We went to Paris.",
    "Mary is tired.",
]
TGT = [
    "Tom a mangé une pomme.",
    "Le chien dort.",
    "Tom a parlé de Boston à Mary.",
    "Tom s'est vu.",  # "Tom" twice in English, once in French: not the same name use
    "Nous sommes allés à Paris.",
    "Marie est fatiguée.",  # written differently: not copied
]


def test_shared_name_is_a_capitalised_word_used_alike_on_both_sides():
    assert [shared_name(s, t) for s, t in zip(SRC, TGT, strict=True)] == [
        "Tom",
        None,
        "Tom",
        None,
        "Paris",
        None,
    ]
    assert shared_name("Tomás laughs.", "Tom rit.") is None  # whole words only
    # A capitalised word the corpus also writes in lowercase is a common word, not a name.
    assert shared_name("Six dogs run.", "Six chiens courent.") == "Six"
    assert shared_name("Six dogs run.", "Six chiens courent.", {"six"}) is None
    assert shared_name("Six men saw Tom.", "Six hommes ont vu Tom.", {"six"}) == "Tom"


def test_copies_leave_words_the_corpus_writes_in_lowercase():
    src = ["Six dogs run.", "I see six cats."]
    tgt = ["Six chiens courent.", "Je vois six chats."]
    assert name_copies(src, tgt, 1.0, seed=0) == ([], [])


def test_invented_names_start_with_a_consonant_and_vary():
    rng = random.Random(0)
    names = [invented_name(rng) for _ in range(200)]
    assert all(re.fullmatch(r"[A-Z][a-zéèöü]+", n) and n[0] not in "AEIOU" for n in names)
    assert len(set(names)) > 190


def test_copies_replace_the_name_on_both_sides_reproducibly():
    src, tgt = name_copies(SRC, TGT, 1.0, seed=3)
    assert len(src) == len(tgt) == 3  # the pairs with a shared name: 0, 2, 4
    for new_s, new_t, (old_s, old_t, name) in zip(
        src,
        tgt,
        [(SRC[0], TGT[0], "Tom"), (SRC[2], TGT[2], "Tom"), (SRC[4], TGT[4], "Paris")],
        strict=True,
    ):
        (invented,) = set(re.findall(r"\w+", new_s)) - set(re.findall(r"\w+", old_s))
        assert new_s == old_s.replace(name, invented)
        assert new_t == old_t.replace(name, invented)
    assert "Mary" in src[1] and "Boston" in tgt[1]  # only the first shared name changes
    assert name_copies(SRC, TGT, 1.0, seed=3) == (src, tgt)
    assert name_copies(SRC, TGT, 1.0, seed=4) != (src, tgt)
    assert len(name_copies(SRC, TGT, 0.5, seed=3)[0]) == 2  # round(0.5 * 3)
    assert name_copies(SRC, TGT, 0.0, seed=3) == ([], [])


def test_prepare_adds_the_copies_to_training_only_and_caches_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    write_split(tmp_path / "corpus", "train", [*SRC, *EN], [*TGT, *FR])  # EN: no names
    write_split(tmp_path / "corpus", "val", ["Tom runs."], ["Tom court."])
    write_split(tmp_path / "corpus", "test", ["Tom sings."], ["Tom chante."])
    cfg = corpus_config(tmp_path, invented_names=1.0)
    prepared = prepare(cfg, log=quiet)
    train, valid, test = prepared.report.splits
    n = len(SRC) + len(EN)
    assert (train.total, train.invented, train.kept) == (n, 3, n + 3)
    assert prepared.train.src_text[:n] == [*SRC, *EN] and len(prepared.train.src_text) == n + 3
    assert (valid.invented, test.invented) == (0, 0)
    assert prepared.valid.src_text == ["Tom runs."]
    assert f"{n} pairs and 3 copies with invented names, {n + 3} kept" in prepared.report_lines()[0]

    def no_encoding(self: Tokenizer, sentences: list[str]) -> list[list[int]]:
        raise AssertionError("tokenized again although the cache was valid")

    monkeypatch.setattr(Tokenizer, "encode_src", no_encoding)
    again = prepare(cfg, log=quiet)
    assert again.report.cached and again.train == prepared.train
