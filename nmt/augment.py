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
not only the ones a syllable generator writes; some are written in Cyrillic or Greek
("Велкора") or in another script's characters. Only training
splits are touched, after the tokenizer is trained (invented names do not shape the
vocabulary), with a fixed seed (the same copies every run).
"""

from __future__ import annotations

import random
import re
import unicodedata
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
# Real names' letters go beyond them: session 11's misses were "Iñaki", "Begoña", "Conceição"
# and "Gonçalo", and no invented name had held an ñ or a ç, so the rare letters are many.
_COMMON_ONSETS = "b br c ch d dr f g gr h j k kl l m n p pr r s st t tr v w z".split()  # noqa: SIM905
_RARE_ONSETS = "bj cz dh gh gw kw ł ph rz sh sz th ts wr x zb zh ž š č ř".split()  # noqa: SIM905
_RARE_ONSETS += "ñ ç ß ś ź ż ć ň ť ď ş ğ ț ș đ ľ ķ ņ nh lh".split()  # noqa: SIM905
_ONSETS = _COMMON_ONSETS * 8 + _RARE_ONSETS  # weights: a rare onset in about one syllable of six
_PLAIN_VOWELS = "a e i o u a e i o u a e i o u ou ai ie y".split()  # noqa: SIM905
_RARE_VOWELS = "é è ö ü á í ó ú ë ï å ø ã â ê î ô û ā ē ī ō ū ą ę ő ű ÿ æ œ õ ì ò ù ão".split()  # noqa: SIM905
_VOWELS = _PLAIN_VOWELS * 8 + _RARE_VOWELS
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
# A name whose first piece is an English word is read as that word ("Iñaki" -> "Je ...", "Ian",
# "Tobias"): a quarter of the spliced names start with one.
_WORD_HEADS = "i a an the is it in on at to my me he we us so no do go be by or of up".split()  # noqa: SIM905
_WORD_HEAD_SHARE = 0.25
# Names in other scripts ("Светлана" lost its last piece: nothing invented was written so):
# 15 % of names, a third each in Cyrillic, in Greek (transliterated from a Latin name, their
# letters partly in the vocabulary, partly unknown) and in characters of a script the
# vocabulary lacks (Han, Hangul, Kana, Arabic, Hebrew, Devanagari, Thai, Armenian).
_OTHER_SCRIPT_SHARE = 0.15
_CYRILLIC = dict(p.split(":") for p in (  # noqa: SIM905
    "ch:ч sh:ш zh:ж ts:ц kh:х ya:я yu:ю a:а b:б c:к d:д e:е f:ф g:г h:х i:и j:й k:к l:л m:м "
    "n:н o:о p:п q:к r:р s:с t:т u:у v:в w:в x:кс y:ы z:з"
).split())  # fmt: skip
_GREEK = dict(p.split(":") for p in (  # noqa: SIM905
    "th:θ ch:χ ps:ψ ph:φ ks:ξ ou:ου a:α b:β c:κ d:δ e:ε f:φ g:γ h:η i:ι j:ζ k:κ l:λ m:μ n:ν "
    "o:ο p:π q:κ r:ρ s:σ t:τ u:υ v:β w:ω x:ξ y:υ z:ζ"
).split())  # fmt: skip
_TONOS = str.maketrans("αεηιουω", "άέήίόύώ")
# (first and last code point, fewest and most characters) of a script without letter case
_GLYPHS = [(0x4E00, 0x9FA5, 2, 3), (0xAC00, 0xD7A3, 2, 3), (0x3041, 0x3096, 2, 4),
           (0x30A1, 0x30FA, 2, 5), (0x0627, 0x064A, 3, 6), (0x05D0, 0x05EA, 3, 6),
           (0x0915, 0x0939, 3, 6), (0x0E01, 0x0E2E, 3, 6), (0x0561, 0x0586, 4, 8)]  # fmt: skip
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
    """The start of one word and the end of another: "cheval" + "silhouette" -> "Chevalouette";
    or an English word and the end of another: "i" + "silhouette" -> "Ilhouette"."""
    head, tail = rng.choice(words), rng.choice(words)
    if rng.random() < _WORD_HEAD_SHARE:
        head = rng.choice(_WORD_HEADS)
    else:
        head = head[: rng.randint(2, len(head) - 1)]
    return head + tail[rng.randint(1, len(tail) - 2) :]


def _transliterated(name: str, table: dict[str, str]) -> str:
    """`name` written with `table`'s letters, longest match first, diacritics dropped."""
    plain = unicodedata.normalize("NFKD", name.lower()).encode("ascii", "ignore").decode()
    keys = "|".join(sorted(table, key=len, reverse=True))
    return re.sub(keys, lambda m: table[m.group()], plain)


def _other_script(rng: random.Random, latin: str) -> str:
    """`latin` in Cyrillic ("Велкора") or Greek ("Βελκόρα"), or a few characters of a script
    without letter case."""
    roll = rng.random()
    if roll < 1 / 3:
        return _transliterated(latin, _CYRILLIC)
    if roll < 2 / 3:
        greek = re.sub("σ$", "ς", _transliterated(latin, _GREEK))
        i = rng.randrange(len(greek) or 1)  # an accent where that letter is a vowel ("Ελένη")
        return greek[:i] + greek[i : i + 1].translate(_TONOS) + greek[i + 1 :]
    first, last, shortest, longest = rng.choice(_GLYPHS)
    return "".join(chr(rng.randint(first, last)) for _ in range(rng.randint(shortest, longest)))


def invented_name(rng: random.Random, words: Sequence[str] = ()) -> str:
    """A made-up name, capitalised: from one to four syllables ("Brüsan", "Kelovar",
    "Ioaffa"), or, half the time where `words` (four letters or more) are given, spliced from
    two of them; some in another script ("Велкора")."""
    if words and rng.random() < _SPLICED_SHARE:
        name = _spliced_name(rng, words)
    else:
        name = _syllable_name(rng)
    if rng.random() < _OTHER_SCRIPT_SHARE:
        name = _other_script(rng, name) or name  # diacritics only: the Latin name
    return name.capitalize()


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
