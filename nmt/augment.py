"""Invented names: training pairs that teach a model to carry over names it has never seen.

Tatoeba's names are nearly all "Tom" and "Mary", and Multi30k's captions have almost none,
so a model trained on them answers "Helga ate an apple" with "Il a mangé une pomme": it
never learnt that a name is copied, subword by subword, whatever it is. With
`data.invented_names: p`, the training pairs in which a capitalised word is written the same
on both sides ("Tom", "Boston"), and never in lowercase anywhere in the corpus (so not "Six",
"The" or "Red" opening a caption), get p copies each on average in which that word is
replaced, on both sides, by a made-up name, a different one for each copy, some written all
in lowercase or in sentence case. Half the names are made from syllables ("Velkora",
"Brüsan", "Ioaffa"); half are spliced from the start of one corpus word and the end of
another ("Chevalouette"), so that the model copies any sequence of the tokenizer's pieces,
not only the ones a syllable generator writes. Only training
splits are touched, after the tokenizer is trained (invented names do not shape the
vocabulary), with a fixed seed (the same copies every run).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

# A name: a capital and at least one lowercase letter, as a whole word.
_WORD = re.compile(r"\b[A-Z][a-z]+\b")
# A word all in lowercase: a capitalised word also written so is a common word, not a name.
_LOWER = re.compile(r"\b[a-z]+\b")
# Names are made from syllables. Their letters and lengths vary as much as real names do
# (the names set's misses were long names cut short, "Wojciech" -> "Wojcie", names read as
# French words when they start with a vowel, "Anaïs" -> "Il", and names written in
# lowercase): one to four syllables, mostly three or more, rare onsets and diacritics, two
# in five starting with a vowel (French elides before it: "de Anaïs" becomes "d'Anaïs").
_COMMON_ONSETS = "b br c ch d dr f g gr h j k kl l m n p pr r s st t tr v w z".split()  # noqa: SIM905
_RARE_ONSETS = "bj cz dh gh gw kw ł ph rz sh sz th ts wr x zb zh ž š č ř".split()  # noqa: SIM905
_ONSETS = _COMMON_ONSETS * 3 + _RARE_ONSETS  # weights: a rare onset in about one syllable of five
_PLAIN_VOWELS = "a e i o u a e i o u a e i o u ou ai ie y".split()  # noqa: SIM905
_VOWELS = _PLAIN_VOWELS * 3 + "é è ö ü á í ó ú ë ï å ø ã".split()  # noqa: SIM905
_CODAS = ["", "", "", "", "n", "l", "r", "s", "k", "m", "ch", "th", "ck", "sk", "lle", "gh"]
_LENGTHS = (1, 2, 2, 3, 3, 3, 4, 4)
# What real names have and syllables alone rarely wrote (the misses after that: "Raffaella"
# -> "Raffa", "Hinemoa" -> "Hinemo", "Gonçalo" -> "Gonçal"): two vowels meeting across
# syllables, doubled consonants, and a last piece that is a single vowel. So a syllable after
# the first has no onset one time in five, a doubled one one time in ten, and half of the
# names end on a bare vowel.
_HIATUS = 0.2
_DOUBLED = "bb dd ff gg kk ll mm nn pp rr ss tt zz".split()  # noqa: SIM905
_DOUBLED_SHARE = 0.1
_BARE_END = 0.5
_SPLICED_SHARE = 0.5
# How each copy is written: mostly as the corpus writes it; a sixth all in lowercase and a
# sixth in sentence case (how nmt reads an input written in capitals: "I saw helga."), so
# that lowercase names are copied too.
_CASES = ("as is", "as is", "as is", "as is", "lower", "sentence")
# French words that elide before a vowel ("de" -> "d'"), in either direction.
_ELIDING = r"(d|qu|jusqu|lorsqu|puisqu)"


def _whole_word(word: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(word)}\b")


def _onset(rng: random.Random, i: int, vowel_start: bool) -> str:
    if i == 0:
        return "" if vowel_start else rng.choice(_ONSETS)
    roll = rng.random()
    if roll < _HIATUS:
        return ""
    return rng.choice(_DOUBLED) if roll < _HIATUS + _DOUBLED_SHARE else rng.choice(_ONSETS)


def _syllable_name(rng: random.Random) -> str:
    n = rng.choice(_LENGTHS)
    vowel_start = n > 1 and rng.random() < 0.4
    syllables = []
    for i in range(n):
        last = i == n - 1
        coda = "" if last and rng.random() < _BARE_END else rng.choice(_CODAS)
        syllables.append(_onset(rng, i, vowel_start) + rng.choice(_VOWELS) + coda)
    return "".join(syllables)


def _spliced_name(rng: random.Random, words: Sequence[str]) -> str:
    """The start of one word and the end of another: "cheval" + "silhouette" -> "Chevalouette"."""
    head, tail = rng.choice(words), rng.choice(words)
    return head[: rng.randint(2, len(head) - 1)] + tail[rng.randint(1, len(tail) - 2) :]


def invented_name(rng: random.Random, words: Sequence[str] = ()) -> str:
    """A made-up name, capitalised: from one to four syllables ("Brüsan", "Kelovar",
    "Ioaffa"), or, half the time where `words` (four letters or more) are given, spliced from
    two of them."""
    if words and rng.random() < _SPLICED_SHARE:
        return _spliced_name(rng, words).capitalize()
    return _syllable_name(rng).capitalize()


def _starts_with_vowel(word: str) -> bool:
    return word[:1].lower() in "aeiouyàâäáéèêëíìîïóòôöúùûüåøã"


def put_name(tgt: str, old: str, new: str) -> str:
    """The French side with the name `old` replaced by `new`, elision made right: "de Tom"
    becomes "d'Anaïs", and "d'Alice" becomes "de Velkora"."""
    out = _whole_word(old).sub(new, tgt)
    name = re.escape(new)
    if _starts_with_vowel(new):
        return re.sub(rf"\b{_ELIDING}e (?={name}\b)", r"\1'", out, flags=re.IGNORECASE)
    return re.sub(rf"\b{_ELIDING}['’](?={name}\b)", r"\1e ", out, flags=re.IGNORECASE)


def _write_case(text: str, case: str) -> str:
    if case == "lower":
        return text.lower()
    if case == "sentence":
        lowered = text.lower()
        return lowered[:1].upper() + lowered[1:]
    return text


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
    src: list[str], tgt: list[str], copies: float, *, seed: int
) -> tuple[list[str], list[str]]:
    """New pairs: `copies` per pair with a shared name, on average (2.5: two each and a third
    for a fixed half of them), with that name replaced on both sides by an invented one,
    some written in lowercase or sentence case (`_CASES`)."""
    rng = random.Random(seed)
    common = {w for line in (*src, *tgt) for w in _LOWER.findall(line)}
    words = sorted(w for w in common if len(w) >= 4)  # sorted: the same names every run
    candidates = [
        (i, name)
        for i, (s, t) in enumerate(zip(src, tgt, strict=True))
        if (name := shared_name(s, t, common))
    ]
    whole = int(copies)
    chosen = candidates * whole + rng.sample(candidates, round((copies - whole) * len(candidates)))
    new_src, new_tgt = [], []
    for i, name in sorted(chosen):
        other = invented_name(rng, words)
        while other.lower() in common:  # "Le", "Son": a word the corpus has, not a name
            other = invented_name(rng, words)
        case = rng.choice(_CASES)
        new_src.append(_write_case(_whole_word(name).sub(other, src[i]), case))
        new_tgt.append(_write_case(put_name(tgt[i], name, other), case))
    return new_src, new_tgt
