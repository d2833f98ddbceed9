"""Invented names (`data.invented_names`): copies of training pairs with a name written the
same on both sides, the name replaced on both by a made-up one."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from test_data import EN, FR, corpus_config, quiet, write_split

from nmt.augment import _WORD_HEADS, invented_name, name_copies, put_name, shared_name
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


def test_invented_names_vary_in_letters_and_length():
    rng = random.Random(0)
    names = [invented_name(rng) for _ in range(500)]
    assert all(re.fullmatch(r"[^\W\d_][^\W\d_]*", n) and n == n.capitalize() for n in names)
    assert len(set(names)) > 490
    assert min(map(len, names)) <= 3 and max(map(len, names)) >= 14  # "Bra" .. long ones
    assert 0.1 < sum(n[0] in "AEIOUÉÈÖÜÁÍÓÚËÏÅØÃ" for n in names) / len(names) < 0.4
    assert any(not n.isascii() for n in names) and sum(n.isascii() for n in names) > 200


def test_invented_names_have_what_real_names_have():
    """Vowels meeting across syllables ("Ioana"), doubled consonants ("Raffaella"), a bare
    vowel at the end ("Gonçalo"); and with corpus words, half spliced from two."""
    rng = random.Random(1)
    names = [invented_name(rng) for _ in range(1000)]
    assert sum(bool(re.search(r"[aeiou][aeiou]", n[1:])) for n in names) > 200
    assert sum(bool(re.search(r"(bb|dd|ff|gg|kk|ll|mm|nn|pp|rr|ss|tt|zz)", n)) for n in names) > 100
    assert 0.4 < sum(n[-1] in "aeiouyéèöüáíóúëïåøã" for n in names) / len(names) < 0.8
    words = ["cheval", "silhouette", "marchand", "bicycle"]
    spliced = [invented_name(rng, words) for _ in range(900)]

    def from_words(name: str, heads: set[str]) -> bool:  # a head, then a word's end
        n = name.lower()
        tails = {w[i:] for w in words for i in range(1, len(w) - 1)}
        return any(n[:i] in heads and n[i:] in tails for i in range(1, len(n)))

    starts = {w[:i] for w in words for i in range(2, len(w))}  # a word's start, 2+ letters
    english = set(_WORD_HEADS) - starts  # "i", "the": an English word, then a word's end
    # half of 900 spliced, 15 % of those in another script; a quarter with an English word
    assert 330 < sum(from_words(n, starts | english) for n in spliced) < 460
    assert 50 < sum(from_words(n, english) for n in spliced) < 130


def test_some_invented_names_are_in_other_scripts():
    """Cyrillic and Greek (letters partly in the vocabulary) and scripts without letter case."""
    rng = random.Random(2)
    names = [invented_name(rng) for _ in range(2000)]
    cyrillic = [n for n in names if re.fullmatch(r"[А-Яа-яЁё]+", n)]
    greek = [n for n in names if re.fullmatch(r"[\u0370-\u03ff]+", n)]
    uncased = [n for n in names if n.lower() == n.upper()]
    assert all(n[0].isupper() for n in cyrillic + greek)
    assert 60 < len(cyrillic) < 140 and 60 < len(greek) < 140 and 60 < len(uncased) < 140
    assert sum(bool(re.search("[άέήίόύώ]", n.lower())) for n in greek) > len(greek) / 3
    assert {"Ñ", "ñ", "Ç", "ç"} & set("".join(names))  # letters that no name held before


def test_put_name_makes_french_elision_right():
    assert put_name("Il parle de Tom.", "Tom", "Anaïs") == "Il parle d'Anaïs."
    assert put_name("Je sais que Tom est là.", "Tom", "Ida") == "Je sais qu'Ida est là."
    assert put_name("Le livre d'Alice.", "Alice", "Velkora") == "Le livre de Velkora."
    assert put_name("Le livre d’Alice.", "Alice", "Velkora") == "Le livre de Velkora."
    assert put_name("De Tom à Tom.", "Tom", "Ugo") == "D'Ugo à Ugo."
    assert put_name("Le livre de Tom.", "Tom", "Velkora") == "Le livre de Velkora."
    assert put_name("Demande à Tom.", "Tom", "Ida") == "Demande à Ida."  # "de" inside a word


def _sentence_case(text: str) -> str:
    return text[:1].upper() + text[1:].lower()


def test_copies_replace_the_name_on_both_sides_reproducibly():
    src, tgt = name_copies(SRC, TGT, 1.0, seed=3)
    assert len(src) == len(tgt) == 3  # the pairs with a shared name: 0, 2, 4
    for new_s, new_t, (old_s, old_t, name) in zip(
        src,
        tgt,
        [(SRC[0], TGT[0], "Tom"), (SRC[2], TGT[2], "Tom"), (SRC[4], TGT[4], "Paris")],
        strict=True,
    ):
        words = set(re.findall(r"\w+", new_s.lower())) - set(re.findall(r"\w+", old_s.lower()))
        (invented,) = {w.capitalize() for w in words}
        # as written, all in lowercase or in sentence case, the same on both sides
        write = next(
            w for w in (str, str.lower, _sentence_case) if new_s == w(old_s.replace(name, invented))
        )
        assert new_t == write(put_name(old_t, name, invented))
    assert name_copies(SRC, TGT, 1.0, seed=3) == (src, tgt)
    assert name_copies(SRC, TGT, 1.0, seed=4) != (src, tgt)
    assert len(name_copies(SRC, TGT, 0.5, seed=3)[0]) == 2  # round(0.5 * 3)
    assert name_copies(SRC, TGT, 0.0, seed=3) == ([], [])
    two, _ = name_copies(SRC, TGT, 2.5, seed=3)
    assert len(two) == 8  # 2 * 3 + round(0.5 * 3)
    assert sum(s.endswith("an apple.") for s in two) in (2, 3)  # pair 0: twice, maybe thrice


def test_copies_are_sometimes_written_in_lowercase_and_sentence_case():
    src, tgt = ["Yesterday I saw Tom."] * 300, ["Hier, j'ai vu Tom."] * 300
    new_src, new_tgt = name_copies(src, tgt, 1.0, seed=0)
    lower = sum(s == s.lower() for s in new_src)
    sentence = sum(s[0] == "Y" and s[1:] == s[1:].lower() for s in new_src)
    assert 20 < lower < 90 and 20 < sentence < 90
    assert all((s == s.lower()) == (t == t.lower()) for s, t in zip(new_src, new_tgt, strict=True))


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
