"""Greedy and beam search: hand-made log-probability tables with a known best, n-best order,
length limits and penalties, beam=1 = greedy and batched = alone on real (random) models."""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from nmt.config import config_from_dict
from nmt.model import build_model
from nmt.search import (
    Hypothesis,
    LengthPenalty,
    SearchResult,
    _best,
    _top,
    beam_search,
    greedy,
    normalise,
)
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID

A, B_, C = 4, 5, 6  # the three words of the hand-made vocabulary (0-3 are the special ids)
V = 7
WORDS = (A, B_, C)


def table(rows: dict[int, dict[int, float]]) -> Tensor:
    """Next-token probabilities by previous token -> (V, V) log-probabilities."""
    probs = torch.zeros(V, V)
    for prev, nxt in rows.items():
        for tok, p in nxt.items():
            probs[prev, tok] = p
    assert torch.allclose(probs[[BOS_ID, *WORDS]].sum(1), torch.ones(4))
    probs[[PAD_ID, 1, EOS_ID]] = 1.0 / V  # rows the search never reads
    return probs.log()


# Greedy takes `a` (0.6) and then stops: p(a) = 0.24. The best output is `b` (0.4 * 0.9).
GREEDY_TRAP = table(
    {
        BOS_ID: {A: 0.6, B_: 0.4},
        A: {EOS_ID: 0.4, C: 0.32, B_: 0.28},
        B_: {EOS_ID: 0.9, A: 0.06, C: 0.04},
        C: {EOS_ID: 1.0},
    }
)
# `b` (0.35) beats `a c` (0.342) on raw probability, but not per token: the penalty decides.
LONGER_PER_TOKEN = table(
    {
        BOS_ID: {A: 0.5, B_: 0.5},
        A: {C: 0.72, EOS_ID: 0.28},
        B_: {EOS_ID: 0.7, A: 0.2, C: 0.1},
        C: {EOS_ID: 0.95, A: 0.05},
    }
)
# Never ends: only the length limit stops it.
ENDLESS = table({BOS_ID: {A: 1.0}, A: {B_: 0.7, C: 0.3}, B_: {A: 1.0}, C: {A: 1.0}})
TABLES = torch.stack([GREEDY_TRAP, LONGER_PER_TOKEN, ENDLESS])


@dataclass
class TableEncoded:
    which: Tensor  # (B,) the table each sentence decodes with
    lens: Tensor  # (B,)
    width: int  # S, the padded source length
    group: int = 1  # decoder rows per sentence (beam search's K)

    def select(self, index: Tensor) -> TableEncoded:
        return TableEncoded(self.which[index], self.lens[index], self.width, self.group)

    def beams(self, k: int) -> TableEncoded:
        return TableEncoded(self.which, self.lens, self.width, self.group * k)

    def rows(self, x: Tensor) -> Tensor:
        return x.repeat_interleave(self.group)  # (B*group,)


@dataclass
class TableState:
    steps: Tensor  # (B,) tokens read so far

    def select(self, index: Tensor) -> TableState:
        return TableState(self.steps[index])


class TableModel:
    """A first-order Markov chain per sentence, chosen by the sentence's first source token
    (the table index). Attention at step t is one-hot on source position t mod its length."""

    def encode(self, src: Tensor, src_lens: Tensor) -> TableEncoded:
        return TableEncoded(src[:, 0], src_lens.clone(), src.size(1))

    def init_state(self, enc: TableEncoded) -> TableState:
        n = enc.which.numel()
        return TableState(torch.zeros(n, dtype=torch.long))

    def step(
        self, prev: Tensor, state: TableState, enc: TableEncoded
    ) -> tuple[Tensor, TableState, Tensor]:
        which, lens = enc.rows(enc.which), enc.rows(enc.lens)  # (B*group,)
        logits = TABLES[which, prev]  # (B*group, V)
        attn = torch.nn.functional.one_hot(state.steps % lens, enc.width).float()  # (B*group, S)
        return logits, TableState(state.steps + 1), attn


def sources(which: list[int], lens: list[int]) -> tuple[Tensor, Tensor]:
    """A padded batch whose sentence i uses table which[i] and has lens[i] tokens."""
    src = torch.zeros(len(which), max(lens), dtype=torch.long)
    for i, (w, n) in enumerate(zip(which, lens, strict=True)):
        src[i, :n] = 4
        src[i, 0] = w
    return src, torch.tensor(lens)


def logprob_of(which: int, tokens: list[int], *, eos: bool = True) -> float:
    seq = [BOS_ID, *tokens, *([EOS_ID] if eos else [])]
    return sum(float(TABLES[which, p, n]) for p, n in itertools.pairwise(seq))


def oracle(
    which: int, *, penalty: LengthPenalty, alpha: float = 0.0, min_len: int = 0
) -> list[int]:
    """The best finished output by exhaustive enumeration (outputs up to 5 words)."""
    best, best_score = None, -math.inf
    for n in range(min_len, 6):
        for toks in itertools.product(WORDS, repeat=n):
            lp = logprob_of(which, list(toks))
            score = normalise(lp, n + 1, length_penalty=penalty, alpha=alpha)
            if score > best_score:
                best, best_score = list(toks), score
    assert best is not None
    return best


def run_beam(which: list[int], lens: list[int], **kw) -> SearchResult:
    opts: dict[str, Any] = dict(
        beam=2,
        nbest=1,
        length_penalty="none",
        alpha=0.0,
        max_len_ratio=0.0,
        max_len_const=10,
        min_len=0,
    )
    opts.update(kw)
    src, src_lens = sources(which, lens)
    return beam_search(TableModel(), src, src_lens, **opts)  # type: ignore[arg-type]


def run_greedy(which: list[int], lens: list[int], **kw) -> SearchResult:
    opts: dict[str, Any] = dict(max_len_ratio=0.0, max_len_const=10, min_len=0)
    opts.update({k: v for k, v in kw.items() if k not in ("beam", "nbest")})
    src, src_lens = sources(which, lens)
    return greedy(TableModel(), src, src_lens, **opts)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- hand-made tables


def test_beam_finds_the_best_that_greedy_misses():
    assert oracle(0, penalty="none") == [B_]
    (g,) = run_greedy([0], [3]).best
    assert g.tokens == [A]
    assert g.score == pytest.approx(math.log(0.6 * 0.4))
    (b,) = run_beam([0], [3], beam=2).best
    assert b.tokens == [B_]
    assert b.finished
    assert b.logprob == pytest.approx(math.log(0.4 * 0.9))


def test_greedy_takes_the_first_of_equal_bests(monkeypatch):
    """An exact tie between two words goes to the lower id, at every position of the row
    (a vectorised maximum may scan a row in chunks: the tie sits in different ones)."""
    wide = 40  # columns: the tie between ids 4 and 37 spans a vector register or more
    probs = torch.full((wide, wide), 0.0)
    probs[:, EOS_ID] = 1.0
    probs[BOS_ID] = 0.0
    probs[BOS_ID, [A, wide - 3]] = 0.5
    tables = probs.log().unsqueeze(0)
    monkeypatch.setattr(sys.modules[__name__], "TABLES", tables)
    (g,) = run_greedy([0], [3]).best
    assert g.tokens == [A]
    assert g.score == pytest.approx(math.log(0.5))


def test_nbest_is_ordered_by_score_and_scores_are_the_sequence_logprobs():
    (hyps,) = run_beam([0], [3], beam=3, nbest=3).hypotheses
    assert [h.tokens for h in hyps] == [[B_], [A], [A, C]]  # 0.36 > 0.24 > 0.192
    for h in hyps:
        assert h.score == pytest.approx(logprob_of(0, h.tokens))
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


@pytest.mark.parametrize(
    "penalty, alpha, expected",
    [("none", 0.0, [B_]), ("average", 0.0, [A, C]), ("gnmt", 1.0, [A, C])],
)
def test_length_penalty_changes_the_winner_as_the_oracle_says(penalty, alpha, expected):
    assert oracle(1, penalty=penalty, alpha=alpha) == expected
    (h,) = run_beam([1], [3], beam=2, length_penalty=penalty, alpha=alpha).best
    assert h.tokens == expected
    length = len(expected) + 1
    assert h.score == pytest.approx(
        normalise(logprob_of(1, expected), length, length_penalty=penalty, alpha=alpha)
    )


def test_normalise_formulas():
    assert normalise(-6.0, 3, length_penalty="none", alpha=0.6) == -6.0
    assert normalise(-6.0, 3, length_penalty="average", alpha=0.6) == -2.0
    assert normalise(-6.0, 1, length_penalty="gnmt", alpha=0.6) == -6.0  # ((5+1)/6)^a = 1
    assert normalise(-6.0, 7, length_penalty="gnmt", alpha=1.0) == pytest.approx(-3.0)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_min_len_forbids_early_eos(search):
    expected = oracle(0, penalty="none", min_len=2)
    assert expected == [A, C]
    run = run_greedy if search == "greedy" else run_beam
    (h,) = run([0], [3], min_len=2).best
    assert h.tokens == expected


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_length_limit_from_ratio_and_constant(search):
    run = run_greedy if search == "greedy" else run_beam
    # Sources of 2 and 4 tokens, limit floor(1.5 * len + 1): 4 and 7 tokens.
    short, long = run([2, 2], [2, 4], max_len_ratio=1.5, max_len_const=1).best
    for h, limit, src_len in ((short, 4, 2), (long, 7, 4)):
        assert len(h.tokens) == limit
        assert not h.finished
        assert h.attention.shape == (limit, src_len)
        assert h.logprob == pytest.approx(logprob_of(2, h.tokens, eos=False))


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_attention_follows_the_hypothesis_and_covers_the_real_source(search):
    run = run_greedy if search == "greedy" else run_beam
    hyps = run([1, 0], [2, 5]).best
    for h, src_len in zip(hyps, (2, 5), strict=True):
        assert h.finished
        assert h.attention.shape == (len(h.tokens) + 1, src_len)
        where = h.attention.argmax(dim=1)
        assert torch.equal(where, torch.arange(len(h.tokens) + 1) % src_len)


def test_nbest_cannot_exceed_beam():
    with pytest.raises(ValueError, match="nbest"):
        run_beam([0], [3], beam=2, nbest=3)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_each_sentence_gets_what_it_gets_alone(search):
    run = run_greedy if search == "greedy" else run_beam
    which, lens = [0, 1, 2, 1, 0], [3, 1, 6, 4, 2]
    together = run(which, lens, max_len_ratio=1.0, max_len_const=1, beam=3, nbest=3)
    for i, (w, n) in enumerate(zip(which, lens, strict=True)):
        (alone,) = run([w], [n], max_len_ratio=1.0, max_len_const=1, beam=3, nbest=3).hypotheses
        assert_same(together.hypotheses[i], alone)


def assert_same(got: list[Hypothesis], want: list[Hypothesis], atol: float = 1e-5) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.finished for h in got] == [h.finished for h in want]
    for g, w in zip(got, want, strict=True):
        assert g.score == pytest.approx(w.score, abs=atol)
        assert g.logprob == pytest.approx(w.logprob, abs=atol)
        assert g.attention.shape == w.attention.shape
        assert torch.allclose(g.attention, w.attention, atol=atol)


# --------------------------------------------------------------------------- real models

LIMITS: dict[str, Any] = dict(max_len_ratio=1.5, max_len_const=3, min_len=0)
BEAM: dict[str, Any] = dict(length_penalty="gnmt", alpha=0.6, **LIMITS)
PROBE_LENS = [6, 2, 9, 4, 7, 3]
COMBOS = [
    (attention, decoder, feed)
    for attention in ("dot", "scaled_dot", "bilinear", "concat")
    for decoder, feed in (("bahdanau", False), ("luong", False), ("luong", True))
]


def tiny_model(attention: str = "concat", decoder: str = "bahdanau", feed: bool = False, **kw):
    """A random, seeded model; its output layer is sharpened (random weights give flat
    distributions, where every step is a near tie)."""
    model_cfg = {
        "emb_size": 12,
        "enc_hidden": 10,
        "dec_hidden": 14,
        "attention": attention,
        "decoder": decoder,
        "input_feeding": feed,
        "dropout": 0.0,
        **kw,
    }
    cfg = config_from_dict({"model": model_cfg})
    torch.manual_seed(0)
    joint = cfg.model.copy  # copy attention writes source ids as target ids
    model = build_model(
        cfg.model, src_vocab_size=30, tgt_vocab_size=30 if joint else 25, shared_vocab=joint
    )
    with torch.no_grad():
        model.generator.out.weight *= 6.0
    return model.eval()


def random_batch(lens: list[int], seed: int = 1) -> tuple[Tensor, Tensor]:
    """Source ids (words then EOS, padded) of the given lengths, EOS included."""
    g = torch.Generator().manual_seed(seed)
    src = torch.zeros(len(lens), max(lens), dtype=torch.long)
    for i, n in enumerate(lens):
        src[i, : n - 1] = torch.randint(4, 30, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src, torch.tensor(lens)


@pytest.mark.parametrize("copy", [False, True], ids=["", "copy"])
@pytest.mark.parametrize("attention, decoder, feed", COMBOS)
def test_beam_of_one_equals_greedy(attention, decoder, feed, copy):
    assert_beam_of_one_is_greedy(tiny_model(attention, decoder, feed, copy=copy))


def assert_beam_of_one_is_greedy(model) -> None:
    src, lens = random_batch(PROBE_LENS)
    g = greedy(model, src, lens, **LIMITS)
    b = beam_search(model, src, lens, beam=1, nbest=1, **BEAM)
    for gh, bh in zip(g.best, b.best, strict=True):
        assert gh.tokens == bh.tokens
        assert gh.logprob == pytest.approx(bh.logprob, abs=1e-5)
        assert torch.allclose(gh.attention, bh.attention, atol=1e-6)


@pytest.mark.parametrize("copy", [False, True], ids=["", "copy"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_sentence_alone_equals_sentence_in_a_batch(cell, search, copy):
    model = tiny_model("concat", "luong", True, cell=cell, copy=copy)
    lens = [5, 1, 9, 3, 7]
    src, src_lens = random_batch(lens)

    def run(s: Tensor, n: Tensor) -> SearchResult:
        if search == "greedy":
            return greedy(model, s, n, **LIMITS)
        return beam_search(model, s, n, beam=4, nbest=4, **BEAM)

    together = run(src, src_lens)
    for i, n in enumerate(lens):
        alone = run(src[i : i + 1, :n], src_lens[i : i + 1])
        assert_same(together.hypotheses[i], alone.hypotheses[0])


@pytest.mark.parametrize(
    "attention, decoder, feed", [("dot", "bahdanau", False), ("concat", "luong", False)]
)
def test_beam_scores_and_attention_match_teacher_forcing(attention, decoder, feed):
    """Rescoring each n-best output with `forward` gives the search's log-probability and
    attention: the beams' states were reordered with their tokens."""
    model = tiny_model(attention, decoder, feed)
    src, lens = random_batch([6, 2, 9, 4])
    result = beam_search(model, src, lens, beam=5, nbest=5, **BEAM)
    n_checked, finished = 0, set()
    for i, hyps in enumerate(result.hypotheses):
        assert len(hyps) == 5
        for h in hyps:
            tgt_in = torch.tensor([[BOS_ID, *h.tokens]])
            tgt_out = torch.tensor(h.tokens + ([EOS_ID] if h.finished else []))
            with torch.no_grad():
                out = model(src[i : i + 1], lens[i : i + 1], tgt_in)
                logits, attn = out.logits, out.attention
            logp = logits[0].float().log_softmax(-1)[: tgt_out.numel()]
            expected = float(logp.gather(1, tgt_out.unsqueeze(1)).sum())
            assert h.logprob == pytest.approx(expected, abs=1e-4)
            n = int(lens[i])
            assert torch.allclose(h.attention, attn[0, : tgt_out.numel(), :n], atol=1e-5)
            n_checked += 1
            finished.add(h.finished)
    assert n_checked == 20
    assert finished == {True, False}  # outputs ended by EOS and cut by the limit are checked


class SpecialsFirstModel(TableModel):
    """The tables, with PAD and BOS made the likeliest next tokens everywhere: a search
    that forgot to forbid them would emit them."""

    def step(
        self, prev: Tensor, state: TableState, enc: TableEncoded
    ) -> tuple[Tensor, TableState, Tensor]:
        logits, state, attn = super().step(prev, state, enc)
        logits = logits.clone()
        logits[:, PAD_ID] = 5.0
        logits[:, BOS_ID] = 4.0
        return logits, state, attn


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_search_never_emits_pad_or_bos_even_when_they_are_likeliest(search):
    src, src_lens = sources([0, 1, 2], [3, 4, 2])
    limits: dict[str, Any] = dict(max_len_ratio=0.0, max_len_const=6, min_len=0)
    if search == "greedy":
        result = greedy(SpecialsFirstModel(), src, src_lens, **limits)  # type: ignore[arg-type]
    else:
        result = beam_search(
            SpecialsFirstModel(),  # type: ignore[arg-type]
            src,
            src_lens,
            beam=3,
            nbest=3,
            length_penalty="none",
            alpha=0.0,
            **limits,
        )
    for hyps in result.hypotheses:
        for h in hyps:
            assert PAD_ID not in h.tokens and BOS_ID not in h.tokens, h.tokens
    # The words come from the tables as without the specials.
    without = run_greedy([0], [3]) if search == "greedy" else run_beam([0], [3], beam=3)
    assert result.best[0].tokens == without.best[0].tokens


@pytest.mark.parametrize("kind", ["distinct", "ties", "mostly_minus_inf"])
@pytest.mark.parametrize("columns", [64 * 51, 64 * 4, 64 * 3, 500])
def test_maximum_by_blocks_is_max_with_the_first_column(kind: str, columns: int) -> None:
    """`_best` (blocks' maxima first) against `max(dim=1)`: the same values and the same
    columns, the first of equal ones (greedy's choice among ties); rows of -inf but one
    column, a row of nothing finite, a width of too few blocks and one of no whole number of
    blocks (`max` itself)."""
    gen = torch.Generator().manual_seed(columns)
    cand = torch.randn(9, columns, generator=gen)
    if kind == "ties":
        cand = cand.mul(2).round()  # the largest value in several columns of a row
        cand[1, :] = 0.0  # a whole row of ties: column 0
        cand[2, [70 % columns, columns - 1]] = 9.0  # ties in two blocks: the earlier one
    elif kind == "mostly_minus_inf":
        cand[:, columns // 3 :] = -math.inf
        cand[0] = -math.inf  # a row with nothing finite: column 0, as max gives
        cand[1, :-1] = -math.inf  # one finite column, the last
    top, at = _best(cand)
    want, want_at = cand.max(dim=1)
    assert torch.equal(top, want) and torch.equal(at, want_at)


@pytest.mark.parametrize("kind", ["distinct", "ties", "mostly_minus_inf"])
@pytest.mark.parametrize("columns", [5 * 64 * 9, 5 * 64 * 40, 5 * 64 * 4, 5 * 100])
def test_two_stage_top_k_gives_top_ks_values_and_their_columns(kind: str, columns: int) -> None:
    """`_top` (blocks' maxima first) against `topk`: the same values in the same order, and
    columns that hold them; with ties (bf16 logits repeat values), any columns that do; rows
    of -inf (beam search's empty beams), a width that is no whole number of blocks
    (`topk` itself) and one with too few blocks to gain."""
    gen = torch.Generator().manual_seed(columns)
    cand = torch.randn(7, columns, generator=gen)
    if kind == "ties":
        cand = cand.mul(2).round()  # a few values, each many times
    elif kind == "mostly_minus_inf":
        cand[:, columns // 3 :] = -math.inf
        cand[0] = -math.inf  # a row with nothing finite
    top, idx = _top(cand, 10)
    want, _ = cand.topk(10, dim=1)
    assert torch.equal(top, want)
    assert torch.equal(cand.gather(1, idx), top)
    assert all(len(set(row)) == 10 for row in idx.tolist())  # ten different columns a row
