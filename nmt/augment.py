"""Invented names: training pairs that teach a model to carry over names it has never seen.

Tatoeba's names are nearly all "Tom" and "Mary", and Multi30k's captions have almost none,
so a model trained on them answers "Helga ate an apple" with "Il a mangé une pomme": it
never learnt that a name is copied, subword by subword, whatever it is. With
`data.invented_names: p`, a fraction p of the training pairs in which a capitalised word is
written the same on both sides ("Tom", "Boston"), and never in lowercase anywhere in the
corpus (so not "Six", "The" or "Red" opening a caption), get a copy in which that word is replaced,
on both sides, by a name made up from syllables ("Velkora", "Brüsan"), a different one for
each copy. Only training splits are touched, after the tokenizer is trained (invented names
do not shape the vocabulary), with a fixed seed (the same copies every run).
"""

from __future__ import annotations

import random
import re

# A name: a capital and at least one lowercase letter, as a whole word.
_WORD = re.compile(r"\b[A-Z][a-z]+\b")
# A word all in lowercase: a capitalised word also written so is a common word, not a name.
_LOWER = re.compile(r"\b[a-z]+\b")
# Consonant onsets and vowels (some accented, as in Chloé, Zürich, François): names start
# with a consonant, so that French elision ("de Tom", never "d'Tom") stays right.
_ONSETS = "b br c ch d dr f g gr h j k kl l m n p pr r s st t tr v w z".split(" ")  # noqa: SIM905
_VOWELS = "a a e e i o o u ou ai é è ö ü".split(" ")  # noqa: SIM905
_CODAS = ["", "", "", "n", "l", "r", "s", "k", "m"]


def _whole_word(word: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(word)}\b")


def invented_name(rng: random.Random) -> str:
    """Two or three syllables, capitalised: "Brüsan", "Kelovar"."""
    syllables = [
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        for _ in range(rng.choice((2, 2, 3)))
    ]
    return "".join(syllables).capitalize()


def shared_name(src: str, tgt: str, common: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The first capitalised word written the same, as often, on both sides and whose
    lowercase form is not in `common` (the corpus's lowercase words); None if none."""
    for word in dict.fromkeys(_WORD.findall(src)):
        if word.lower() in common:
            continue
        pattern = _whole_word(word)
        if len(pattern.findall(src)) == len(pattern.findall(tgt)):
            return word
    return None


def name_copies(
    src: list[str], tgt: list[str], fraction: float, *, seed: int
) -> tuple[list[str], list[str]]:
    """New pairs: for `fraction` of the pairs with a shared name (a fixed sample), the pair
    with that name replaced on both sides by an invented one."""
    rng = random.Random(seed)
    common = {w for line in (*src, *tgt) for w in _LOWER.findall(line)}
    candidates = [
        (i, name)
        for i, (s, t) in enumerate(zip(src, tgt, strict=True))
        if (name := shared_name(s, t, common))
    ]
    chosen = sorted(rng.sample(candidates, round(fraction * len(candidates))))
    new_src, new_tgt = [], []
    for i, name in chosen:
        other = invented_name(rng)
        pattern = _whole_word(name)
        new_src.append(pattern.sub(other, src[i]))
        new_tgt.append(pattern.sub(other, tgt[i]))
    return new_src, new_tgt
