"""A vocabulary shortlist for decoding (Marian's lexical shortlist): per batch, the output
layer computes only the target pieces a translation of these sentences can plausibly use.

Built once at training time from the training pairs: the `frequent` most frequent target
pieces, and for every source piece the `per_source` target pieces most associated with it
(Dice's coefficient of sentence co-occurrence, 2·c(s, t) / (c(s) + c(t)): a piece that
occurs everywhere is not associated with everything). A batch's columns are those pieces
for its source pieces, the frequent ones, EOS and UNK, and, with a joint vocabulary, the
source pieces themselves (copy attention copies them; names pass through unchanged),
rounded up to a multiple of 64 columns with the lowest ids not yet in (BLAS products are
much faster at such widths). The table is a few megabytes of plain tensors, stored in the
checkpoint.

Decoding with it (`Seq2Seq.encode` when the model carries one) computes the output layer
for the L columns only, a (D, L) product instead of (D, V); `step` returns (B, L) scores and
the searches map their choices back to target ids (`Restricted.columns`). The copy mixture
places the source pieces at their columns. Ensembles decode over the whole vocabulary (their
members' lists differ). What it may lose is a piece outside the list
that the full model would have chosen; docs/benchmarks.md gives validation BLEU with and
without it.

Shape legend: N training pairs used, Vs / Vt source / target vocabulary, K per_source,
F frequent, B sentences, S source length, L columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

if TYPE_CHECKING:
    from nmt.int8 import Int8Rows
    from nmt.laid_out import LaidOut

# With FREQUENT, tuned on Multi30k val on two models in session 15 (docs/benchmarks.md): 20
# and 500 decode 1.2-1.3x faster than 100 and 1,000, BLEU within 0.1 of the full vocabulary.
PER_SOURCE = 20
FREQUENT = 500
MAX_PAIRS = 100_000  # co-occurrences are counted on a fixed sample: enough for the top K
# A batch's column count is rounded up to a multiple of this: the BLAS product of 320 rows
# (64 sentences x beam 5) by 512 x L runs ~1.4x faster at L = 5200 than at L = 5193 on an
# AVX2 CPU (session 15, docs/benchmarks.md).
COLUMN_MULTIPLE = 64


@dataclass(frozen=True)
class Restricted:
    """An output layer cut to a batch's shortlist (`nmt.model.Generator.restrict`)."""

    columns: Tensor  # (L,) int64 sorted target ids
    weight: Tensor | Int8Rows | LaidOut  # (L, E); int8 rows (nmt.int8) or laid out (nmt.laid_out)
    bias: Tensor  # (L,)

    def positions(self, ids: Tensor) -> Tensor:
        """Target ids (any shape) -> their positions among the columns (ids in them)."""
        return torch.searchsorted(self.columns, ids)


@dataclass(frozen=True)
class Shortlist:
    frequent: Tensor  # (F,) int64 target ids, most frequent first
    table: Tensor  # (Vs, K) int64 target ids per source id, best first; -1 where fewer
    joint: bool  # source ids are target ids: they are kept too (copying)

    def columns(self, src: Tensor, vocab_size: int) -> Tensor:
        """src (B, S) int64 -> (L,) int64 the sorted target ids a batch may produce, out of a
        target vocabulary of `vocab_size`, L a multiple of COLUMN_MULTIPLE where it has that
        many: the lowest ids not already in make up the count (sentencepiece numbers a
        vocabulary by score, so those are common pieces; a column more is never a loss)."""
        ids = self._listed(src)  # (L0,)
        need = -ids.numel() % COLUMN_MULTIPLE
        if not need:
            return ids
        absent = torch.ones(vocab_size, dtype=torch.bool, device=src.device)  # (V,)
        absent[ids] = False
        absent[[PAD_ID, BOS_ID]] = False
        extra = absent.nonzero().squeeze(1)[:need]  # (<= need,) ascending
        return torch.cat([ids, extra]).sort().values  # (L,)

    def _listed(self, src: Tensor) -> Tensor:
        """src (B, S) -> (L0,) sorted: the frequent pieces, those of the table for its source
        pieces, EOS and UNK, and with a joint vocabulary the source pieces themselves."""
        pieces = src.unique()  # (U,)
        parts = [
            self.frequent,
            self.table[pieces].flatten(),  # (U*K,)
            torch.tensor([EOS_ID, UNK_ID], device=src.device),
        ]
        if self.joint:
            parts.append(pieces)
        ids = torch.cat(parts).unique()  # sorted
        return ids[(ids >= 0) & (ids != PAD_ID) & (ids != BOS_ID)]

    def to_state(self) -> dict[str, Tensor | bool]:
        return {"frequent": self.frequent, "table": self.table, "joint": self.joint}

    @classmethod
    def from_state(cls, state: dict, device: torch.device | str = "cpu") -> Shortlist:
        """From a checkpoint, its tables on `device` (the model's: moved once, not per batch)."""
        return cls(
            frequent=state["frequent"].to(device),
            table=state["table"].to(device),
            joint=bool(state["joint"]),
        )


def build(
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    *,
    src_vocab: int,
    tgt_vocab: int,
    joint: bool,
    per_source: int = PER_SOURCE,
    frequent: int = FREQUENT,
    max_pairs: int = MAX_PAIRS,
) -> Shortlist:
    """The shortlist of a training set (ids without BOS/EOS)."""
    sample = torch.randperm(len(src_ids), generator=torch.Generator().manual_seed(0))[:max_pairs]
    take = sorted(sample.tolist(), key=lambda i: len(src_ids[i]) + len(tgt_ids[i]))
    c_t = torch.zeros(tgt_vocab, dtype=torch.long)  # occurrences of each target piece
    c_s_pairs = torch.zeros(src_vocab, dtype=torch.long)  # pairs holding each source piece
    c_t_pairs = torch.zeros(tgt_vocab, dtype=torch.long)
    keys = []
    for start in range(0, len(take), _CHUNK):  # by length: little padding in a chunk
        rows = take[start : start + _CHUNK]
        src = _padded([src_ids[i] for i in rows])  # (n, S) -1 padded
        tgt = _padded([tgt_ids[i] for i in rows])  # (n, T)
        c_t += torch.bincount(tgt[tgt >= 0], minlength=tgt_vocab)
        c_s_pairs += _per_row_counts(src, src_vocab)
        c_t_pairs += _per_row_counts(tgt, tgt_vocab)
        keys.append(_pairs_in_rows(src, tgt, tgt_vocab))
    st, c_st = torch.unique(torch.cat(keys), return_counts=True)  # (P,), (P,)
    s, t = st // tgt_vocab, st % tgt_vocab
    dice = 2 * c_st.double() / (c_s_pairs[s] + c_t_pairs[t]).double()  # (P,)
    return Shortlist(
        frequent=c_t.argsort(descending=True)[:frequent],
        table=_top_per_row(s, t, dice, src_vocab, per_source),
        joint=joint,
    )


_CHUNK = 2048


def _pairs_in_rows(src: Tensor, tgt: Tensor, tgt_vocab: int) -> Tensor:
    """(n, S), (n, T) -1 padded -> the s * Vt + t of every (s, t) of a row, once a row."""
    real = (src[:, :, None] >= 0) & (tgt[:, None, :] >= 0)  # (n, S, T)
    st = (src[:, :, None] * tgt_vocab + tgt[:, None, :])[real]  # (M,)
    row = torch.arange(src.size(0))[:, None, None].expand_as(real)[real]  # (M,)
    span = int(st.max()) + 1 if st.numel() else 1
    return torch.unique(row * span + st) % span


def build_for(
    tokenizer: Tokenizer, src_ids: list[list[int]], tgt_ids: list[list[int]], **sizes: int
) -> Shortlist:
    """`build` with the vocabularies of `tokenizer` (`sizes`: per_source, frequent, ...)."""
    return build(
        src_ids,
        tgt_ids,
        src_vocab=tokenizer.src_vocab_size,
        tgt_vocab=tokenizer.tgt_vocab_size,
        joint=tokenizer.joint,
        **sizes,
    )


def _padded(rows: list[list[int]]) -> Tensor:
    """Rows of ids -> (n, width) int64, -1 after each row's end."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def _per_row_counts(ids: Tensor, vocab: int) -> Tensor:
    """(N, S) -1 padded -> (vocab,) how many rows hold each id."""
    row = torch.arange(ids.size(0))[:, None].expand_as(ids)
    real = ids >= 0
    once = torch.unique(row[real] * vocab + ids[real]) % vocab
    return torch.bincount(once, minlength=vocab)


def _top_per_row(s: Tensor, t: Tensor, score: Tensor, rows: int, k: int) -> Tensor:
    """For each s, the k t with the highest score, best first (-1 where fewer): (rows, k)."""
    order = score.argsort(descending=True, stable=True)
    order = order[s[order].argsort(stable=True)]  # by s, then by score, best first
    s, t = s[order], t[order]
    starts = torch.searchsorted(s, s)  # (P,) the first index of each one's group
    rank = torch.arange(s.numel()) - starts
    keep = rank < k
    table = torch.full((rows, k), -1, dtype=torch.long)
    table[s[keep], rank[keep]] = t[keep]
    return table
