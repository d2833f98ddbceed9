"""Corpus BLEU and chrF through sacrebleu, with signatures, for validation and `nmt eval`.

Scores are never computed by hand: sacrebleu does the tokenisation, counting and
smoothing, and its signature says exactly how, so a number printed here is the number
`sacrebleu REF -i HYP` prints for the same files.

Two protocols:

- `sacrebleu` (default): detokenized, cased text, sacrebleu's own 13a tokenisation.
- `wmt-mmt`: the Multi30k shared-task protocol (WMT 2016-2018 multimodal translation), to
  set our numbers beside the papers'. Hypotheses and references both go through the task's
  own preprocessing (multi30k/dataset scripts/task1-tokenize.sh: `lowercase.perl |
  normalize-punctuation.perl -l L | tokenizer.perl -l L`, here with sacremoses), then BLEU is
  taken on those tokens as they are (tokenize="none"), which is what multi-bleu.perl computes
  on the task's tokenized files. Moses escaping (`'` -> `&apos;`) is left out: it maps tokens
  one to one on both sides, so BLEU is the same with or without it.

sacrebleu and sacremoses are imported when a score is asked for, not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Protocol = Literal["sacrebleu", "wmt-mmt"]
PROTOCOLS: tuple[Protocol, ...] = ("sacrebleu", "wmt-mmt")

# sacrebleu's command line prints scores with one decimal; the line matches it.
LINE_WIDTH = 1


@dataclass(frozen=True)
class Score:
    """One corpus-level score with what is needed to reproduce it."""

    name: str  # "BLEU" or "chrF2"
    score: float  # full precision
    signature: str  # sacrebleu's signature (prefixed by the protocol when not sacrebleu's)
    line: str  # the line sacrebleu's command line prints: "BLEU|<signature> = 41.2 ..."

    def __str__(self) -> str:
        return self.line


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references: expected as many")


def _score(metric: Any, hyps: Sequence[str], refs: Sequence[str], prefix: str = "") -> Score:
    result = metric.corpus_score(list(hyps), [list(refs)])
    signature = prefix + str(metric.get_signature())
    return Score(
        name=result.name,
        score=float(result.score),
        signature=signature,
        line=result.format(width=LINE_WIDTH, signature=signature),
    )


def mmt_preprocess(lines: Sequence[str], lang: str) -> list[str]:
    """Lowercase, normalise punctuation and Moses-tokenize, as the Multi30k task does."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(lang=lang)
    tokenizer = MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower()), escape=False, return_str=True)
        for line in lines
    ]


def bleu(
    hyps: Sequence[str],
    refs: Sequence[str],
    *,
    lowercase: bool = False,
    protocol: Protocol = "sacrebleu",
    lang: str | None = None,
) -> Score:
    """Corpus BLEU of `hyps` against one reference each.

    protocol "wmt-mmt" needs `lang`, the target language (Moses rules differ by language),
    and always lowercases.
    """
    from sacrebleu.metrics import BLEU

    _check(hyps, refs)
    if protocol == "sacrebleu":
        return _score(BLEU(lowercase=lowercase), hyps, refs)
    if protocol == "wmt-mmt":
        if not lang:
            raise ValueError("bleu: protocol 'wmt-mmt' needs the target language (lang)")
        prefix = f"protocol:wmt-mmt|lang:{lang}|"
        # lowercase=True changes nothing in text already lowercased; it puts case:lc in the
        # signature, which is what was done. force=True: the text is tokenized on purpose,
        # so sacrebleu's "forgot to detokenize?" warning does not apply.
        metric = BLEU(lowercase=True, tokenize="none", force=True)
        return _score(metric, mmt_preprocess(hyps, lang), mmt_preprocess(refs, lang), prefix)
    raise ValueError(f"protocol: unknown {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def chrf(hyps: Sequence[str], refs: Sequence[str], *, lowercase: bool = False) -> Score:
    """Corpus chrF (character 6-grams, beta 2) of `hyps` against one reference each."""
    from sacrebleu.metrics import CHRF

    _check(hyps, refs)
    return _score(CHRF(lowercase=lowercase), hyps, refs)
