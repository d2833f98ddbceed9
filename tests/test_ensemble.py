"""Ensembles: the searches over several models decode the renormalised mean of their
log-probabilities; real checkpoints combine only when they share the tokenizer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_search import TABLES, WORDS, TableEncoded, TableModel, sources
from torch import Tensor
from typer.testing import CliRunner

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.ensemble import Ensemble
from nmt.errors import NmtError
from nmt.model import build_model
from nmt.search import beam_search, greedy
from nmt.tokenizer import BOS_ID, EOS_ID, Tokenizer
from nmt.translate import Translator


class TablesModel(TableModel):
    """test_search's Markov-table model over tables of our choosing."""

    def __init__(self, tables: Tensor) -> None:
        self.tables = tables

    def step(self, prev, state, enc: TableEncoded):
        logits, state, attn = super().step(prev, state, enc)
        return self.tables[enc.rows(enc.which), prev], state, attn


def _smooth(tables: Tensor) -> Tensor:
    """Every token a little probability, as a softmax gives: no row of a mean is all -inf."""
    return (0.9 * tables.exp() + 0.1 / tables.size(-1)).log()


def _other_tables() -> Tensor:
    """test_search's tables with each row's word probabilities permuted: a second opinion."""
    g = torch.Generator().manual_seed(0)
    other = _smooth(TABLES)
    for which in range(other.size(0)):
        for prev in (BOS_ID, *WORDS):
            cols = torch.tensor([EOS_ID, *WORDS]) if prev != BOS_ID else torch.tensor(WORDS)
            other[which, prev, cols] = other[
                which, prev, cols[torch.randperm(len(cols), generator=g)]
            ]
    return other


def _search_both(model, src, lens, beam: int):
    if beam == 1:
        return greedy(model, src, lens, max_len_ratio=2.0, max_len_const=3, min_len=0)
    return beam_search(
        model,
        src,
        lens,
        beam=beam,
        nbest=beam,
        length_penalty="average",
        alpha=0.0,
        max_len_ratio=2.0,
        max_len_const=3,
        min_len=0,
    )


@pytest.mark.parametrize("beam", [1, 2, 4])
def test_an_ensemble_decodes_the_renormalised_mean_of_its_members(beam):
    first, second = _smooth(TABLES), _other_tables()
    # What the ensemble should decode: per row, the mean log-probability, renormalised.
    combined = ((first + second) / 2).log_softmax(dim=-1)
    src, lens = sources([0, 1, 2], [3, 2, 4])
    got = _search_both(Ensemble([TablesModel(first), TablesModel(second)]), src, lens, beam)
    want = _search_both(TablesModel(combined), src, lens, beam)
    alone = _search_both(TablesModel(first), src, lens, beam)
    assert [[h.tokens for h in hs] for hs in got.hypotheses] == [
        [h.tokens for h in hs] for hs in want.hypotheses
    ]
    for g_hyps, w_hyps in zip(got.hypotheses, want.hypotheses, strict=True):
        for g, w in zip(g_hyps, w_hyps, strict=True):
            assert g.logprob == pytest.approx(w.logprob, abs=1e-5)
            torch.testing.assert_close(g.attention, w.attention)
    # and the second member changed something: the test can tell the two apart
    assert [h.tokens for h in got.best] != [h.tokens for h in alone.best] or [
        h.logprob for h in got.best
    ] != pytest.approx([h.logprob for h in alone.best])


def test_a_model_ensembled_with_itself_translates_as_it_does_alone(tiny_run):
    alone = Translator.from_checkpoint(tiny_run.checkpoint)
    pair = Translator.from_checkpoint([tiny_run.checkpoint, tiny_run.run_dir])
    assert isinstance(pair.model, Ensemble)
    sentences = tiny_run.train_src[:6]
    for beam in (1, 3):
        a = alone.translate(sentences, beam=beam)
        b = pair.translate(sentences, beam=beam)
        assert [t.text for t in a] == [t.text for t in b]
        assert [t.score for t in a] == pytest.approx([t.score for t in b], abs=1e-4)
        torch.testing.assert_close(a[0].attention, b[0].attention)


def _with_another_tokenizer(tiny_run, tmp_path) -> str:
    """A checkpoint of the tiny model over a tokenizer with a smaller vocabulary."""
    cfg = tiny_run.config
    tok_cfg = dataclasses.replace(cfg.tokenizer, vocab_size=150)
    tok = Tokenizer.train(tiny_run.train_src, tiny_run.train_tgt, tok_cfg, tmp_path, log=print)
    model = build_model(
        cfg.model,
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        shared_vocab=tok.joint,
    )
    state = load_checkpoint(tiny_run.checkpoint)
    state["config"]["tokenizer"]["vocab_size"] = 150
    state.update(tokenizer=tok.to_bytes(), model=model.state_dict())
    path = tmp_path / "other.pt"
    save_checkpoint(state, path)
    return str(path)


def test_members_with_another_vocabulary_are_refused_by_name(tiny_run, tmp_path):
    other = _with_another_tokenizer(tiny_run, tmp_path)
    with pytest.raises(NmtError, match=r"other\.pt: its target vocabulary differs"):
        Translator.from_checkpoint([tiny_run.checkpoint, other])


def test_cli_translate_and_eval_take_several_models(tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    ckpt = str(tiny_run.checkpoint)
    sentence = tiny_run.train_src[0]
    one = runner.invoke(app, ["translate", "-m", ckpt, sentence])
    two = runner.invoke(app, ["translate", "-m", ckpt, "--model", ckpt, sentence])
    assert two.exit_code == 0 and two.stdout == one.stdout
    src, ref = tmp_path / "s.en", tmp_path / "r.fr"
    src.write_text("\n".join(tiny_run.train_src[:4]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(tiny_run.train_tgt[:4]) + "\n", encoding="utf-8")
    scored = runner.invoke(
        app, ["eval", "-m", ckpt, "-m", ckpt, "--src", str(src), "--ref", str(ref), "--json"]
    )
    assert scored.exit_code == 0, scored.output
    other = _with_another_tokenizer(tiny_run, tmp_path)
    bad = runner.invoke(app, ["translate", "-m", ckpt, "-m", other, sentence])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
    assert "target vocabulary differs" in bad.stderr
