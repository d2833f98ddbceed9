"""Text on its way in and out of the model, as pure functions: what the model reads of a
sentence (whitespace, lowercase, capitals), and unknown target pieces filled from the source.
"""

from __future__ import annotations

from collections.abc import Sequence

from nmt.tokenizer import UNK_MARK


def clean_input(sentence: str, *, lowercase: bool) -> tuple[str, bool]:
    """What the model was trained on: whitespace collapsed, lowercased when the run was
    (`data.lowercase`); and whether the input is written in capitals, which is then read in
    sentence case ("HELGA ATE AN APPLE!" -> "Helga ate an apple!") and answered in capitals:
    corpora hold almost no all-capitals text, so a model reads it badly."""
    text = " ".join(sentence.split())
    if lowercase:
        return text.lower(), False
    capitals = 0  # letters that have a case, all capitals so far
    for c in text:
        if c.isalpha() and c.upper() != c.lower():
            if not c.isupper():  # most sentences stop at their second letter
                return text, False
            capitals += 1
    if capitals >= 2:
        lowered = text.lower()
        first = next(i for i, c in enumerate(lowered) if c.isalpha())
        return lowered[:first] + lowered[first].upper() + lowered[first + 1 :], True
    return text, False


def fill_unknowns(text: str, sources: Sequence[int], surfaces: Sequence[str]) -> str:
    """`text` (a decoded hypothesis) with its i-th unknown piece replaced by the source text
    `surfaces[sources[i]]` (the source piece its attention weighs most: Luong et al. 2015,
    "Addressing the rare word problem"): an emoji or a name in a script the vocabulary lacks
    comes through as written. It is joined to its neighbours as it was in the source: "Z",
    <unk>, "rich" for "Zürich" (French training text has no "ü") gives "Zürich", not
    sentencepiece's "Z ⁇ rich". Unchanged but for its spacing when the counts disagree."""
    parts = text.split(UNK_MARK)  # sentencepiece writes each unknown piece as " ⁇ "
    if not surfaces or len(parts) != len(sources) + 1:
        return " ".join(text.split())
    out = parts[0]
    for j, after in zip(sources, parts[1:], strict=True):
        starts_word = j == 0 or surfaces[j][:1].isspace() or not surfaces[j - 1].strip()
        ends_word = j + 1 == len(surfaces) or not surfaces[j + 1][:1].strip()
        out = out.rstrip() + (" " if starts_word else "") + surfaces[j].strip()
        out += (" " if ends_word else "") + after.lstrip()
    return " ".join(out.split())
