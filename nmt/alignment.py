"""What attention weights say about word alignment: weights merged from subword pieces to
words, the strongest source word per target word as an alignment link, and that alignment
scored against a reference one (precision, recall, alignment error rate); plus the
attention's sharpness (mean entropy, share of weight on the most-attended source token).

Words are what whitespace separates in the text, so a statistical word aligner run on the
same text (`scripts/attention_study.py` uses eflomal) aligns the same units. A piece that
starts with sentencepiece's word marker "▁" starts a word; the EOS row and column are not
words and are dropped.

AER (Och and Ney 2003): with predicted links A, sure links S and possible links P (S a
subset of P), precision = |A & P| / |A|, recall = |A & S| / |S|,
AER = 1 - (|A & S| + |A & P|) / (|A| + |S|). Links are (source word, target word) pairs,
both numbered from 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.tokenizer import EOS_PIECE

WORD_MARK = "\u2581"  # sentencepiece's "▁": the piece starts a new word

Links = set[tuple[int, int]]


def word_of_piece(pieces: Sequence[str]) -> list[int]:
    """The word each piece belongs to, numbered from 0 (EOS pieces get -1)."""
    out, word = [], -1
    for piece in pieces:
        if piece == EOS_PIECE:
            out.append(-1)
            continue
        if piece.startswith(WORD_MARK) or word < 0:
            word += 1
        out.append(word)
    return out


def word_attention(
    attention: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> Tensor:
    """(T, S) piece attention -> (Tw, Sw) word attention: a source word gets the sum of its
    pieces' weights (the share of attention it holds), a target word the mean over its
    pieces' rows (each row is one decision)."""
    src_word = torch.tensor(word_of_piece(src_pieces))  # (S,)
    tgt_word = torch.tensor(word_of_piece(tgt_pieces))  # (T,)
    n_src, n_tgt = int(src_word.max()) + 1, int(tgt_word.max()) + 1
    keep_s, keep_t = src_word >= 0, tgt_word >= 0
    a = attention[keep_t][:, keep_s].float()  # (T', S') without EOS
    by_src = torch.zeros(a.size(0), n_src).index_add_(1, src_word[keep_s], a)  # (T', Sw)
    sums = torch.zeros(n_tgt, n_src).index_add_(0, tgt_word[keep_t], by_src)  # (Tw, Sw)
    counts = torch.bincount(tgt_word[keep_t], minlength=n_tgt).clamp(min=1)  # (Tw,)
    return sums / counts.unsqueeze(1)  # (Tw, Sw)


def strongest_links(word_attn: Tensor) -> Links:
    """One link per target word: to the source word with the most attention."""
    best = word_attn.argmax(dim=1).tolist()  # (Tw,)
    return {(s, t) for t, s in enumerate(best)}


def parse_links(line: str) -> Links:
    """Pharaoh format "0-0 1-2 ..." (source-target) -> links."""
    links = set()
    for pair in line.split():
        s, _, t = pair.partition("-")
        links.add((int(s), int(t)))
    return links


@dataclass(frozen=True)
class AlignmentScores:
    precision: float
    recall: float
    aer: float
    sentences: int


def alignment_scores(
    predicted: Iterable[Links], sure: Iterable[Links], possible: Iterable[Links]
) -> AlignmentScores:
    """Corpus-level precision, recall and AER (counts summed over sentences)."""
    a_total = s_total = a_and_s = a_and_p = n = 0
    for a, s, p in zip(predicted, sure, possible, strict=True):
        p = p | s  # S is a subset of P by definition
        a_total += len(a)
        s_total += len(s)
        a_and_s += len(a & s)
        a_and_p += len(a & p)
        n += 1
    return AlignmentScores(
        precision=a_and_p / a_total if a_total else 0.0,
        recall=a_and_s / s_total if s_total else 0.0,
        aer=1.0 - (a_and_s + a_and_p) / (a_total + s_total) if a_total + s_total else 1.0,
        sentences=n,
    )


@dataclass(frozen=True)
class Sharpness:
    entropy: float  # mean over target tokens of the entropy (nats) of their attention row
    max_share: float  # mean over target tokens of the largest weight in their row
    uniform_entropy: float  # mean of log(source length): the entropy of flat attention


def sharpness(attentions: Iterable[Tensor]) -> Sharpness:
    """How peaked the attention rows are, over (T, S) matrices whose rows sum to 1."""
    entropy = top = flat = 0.0
    rows = 0
    for a in attentions:
        a = a.float()
        entropy += float(-(a * a.clamp(min=1e-12).log()).sum())
        top += float(a.max(dim=1).values.sum())
        flat += a.size(0) * math.log(a.size(1))
        rows += a.size(0)
    rows = max(rows, 1)
    return Sharpness(entropy=entropy / rows, max_share=top / rows, uniform_entropy=flat / rows)
