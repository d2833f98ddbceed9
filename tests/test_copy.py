"""Copy attention (nmt.copy): the mixture is a distribution, its loss is the dense one's,
a piece the vocabulary distribution rules out is still written when attention and gate say
so, and copy models search like any other (rescoring here; beam 1 = greedy and batch
independence are tests/test_search.py's, run with copy on and off)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_model import SHAPES, batch, make_model
from test_search import BEAM, random_batch, tiny_model

from nmt.config import config_from_dict
from nmt.copy import copy_loss, mixture_log_probs
from nmt.errors import NmtError
from nmt.model import Output
from nmt.search import beam_search
from nmt.step import token_loss
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID


def _random_mixture_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T, S, V = 3, 4, 5, 11
    logits = torch.randn(B, T, V, generator=g) * 3
    gate = torch.randn(B, T, generator=g) * 2
    src = torch.randint(4, V, (B, S), generator=g)
    src[0, 1] = src[0, 3]  # a piece twice in one source: its copy mass adds up
    src[1, 3:] = PAD_ID  # a padded source
    mask = src != PAD_ID
    scores = torch.randn(B, T, S, generator=g).masked_fill(~mask.unsqueeze(1), -math.inf)
    attention = scores.softmax(-1)
    target = torch.randint(4, V, (B, T), generator=g)
    target[0, 0] = src[0, 1]  # targets that are in the source
    target[2, 1] = src[2, 4]
    target[1, 3] = PAD_ID
    return logits, gate, attention, src, target


def test_the_mixture_sums_to_one():
    logits, gate, attention, src, _ = _random_mixture_inputs()
    lp = mixture_log_probs(
        logits.flatten(0, 1), gate.flatten(), attention.flatten(0, 1), src.repeat_interleave(4, 0)
    )
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(12))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_sparse_loss_equals_cross_entropy_of_the_whole_mixture(smoothing):
    logits, gate, attention, src, target = _random_mixture_inputs()
    # The attention through a softmax, as in the model: its rows stay distributions.
    scores = attention.clamp_min(1e-30).log().requires_grad_(True)
    logits.requires_grad_(True)
    gate.requires_grad_(True)
    attention = scores.softmax(-1)
    got = copy_loss(logits, gate, attention, src, target, smoothing)
    got_grads = torch.autograd.grad(got, (logits, gate, scores), retain_graph=True)
    B, T, S = attention.shape
    dense = mixture_log_probs(
        logits.flatten(0, 1), gate.flatten(), attention.flatten(0, 1), src.repeat_interleave(T, 0)
    )
    want = F.cross_entropy(
        dense, target.flatten(), ignore_index=PAD_ID, label_smoothing=smoothing, reduction="sum"
    )
    want_grads = torch.autograd.grad(want, (logits, gate, scores))
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("copy", [True, False])
def test_the_loss_is_float32_under_the_models_autocast(copy, smoothing):
    """`token_loss` runs inside the update's autocast: its float32 arithmetic (the copy
    mass's `bmm` among it) must not become bf16."""
    logits, gate, attention, src, target = _random_mixture_inputs()
    out = Output(logits, attention, src, gate if copy else None)
    want = token_loss(out, target, smoothing)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = token_loss(out, target, smoothing)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_piece_the_vocabulary_rules_out_is_copied_when_attention_and_gate_say_so():
    V = 9
    logits = torch.zeros(1, V)
    logits[0, 7] = -1e4  # P_vocab(7) ~ 0: generation alone never writes it
    src = torch.tensor([[5, 7, EOS_ID]])
    attention = torch.tensor([[0.02, 0.96, 0.02]])
    copy_it = torch.tensor([-4.0])  # g = 0.018: the gate says copy
    lp = mixture_log_probs(logits, copy_it, attention, src)
    assert int(lp.argmax()) == 7
    assert float(lp[0, 7].exp()) == pytest.approx(float(torch.sigmoid(torch.tensor(4.0))) * 0.96)
    generate = torch.tensor([6.0])  # g ~ 1: the vocabulary decides, and 7 stays out
    assert (
        lp.size(1) == V and int(mixture_log_probs(logits, generate, attention, src).argmax()) != 7
    )


def test_no_copy_mass_gives_finite_gradients():
    logits, gate, attention, src, target = _random_mixture_inputs()
    target[:] = 1  # never in the source: Σ a_i [x_i = y] = 0 everywhere
    logits.requires_grad_(True)
    attention.requires_grad_(True)
    copy_loss(logits, gate, attention, src, target, 0.1).backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(attention.grad).all()


@pytest.mark.parametrize(
    "attention, decoder, feed",
    [("dot", "bahdanau", False), ("bilinear", "luong", False), ("concat", "luong", True)],
)
def test_copy_search_scores_match_the_teacher_forced_mixture(attention, decoder, feed):
    """Each n-best output rescored by `forward` and the mixture gives the search's
    log-probability: `step` and `forward` form the same distribution."""
    model = tiny_model(attention, decoder, feed, copy=True)
    src, lens = random_batch([6, 2, 9, 4])
    result = beam_search(model, src, lens, beam=3, nbest=3, **BEAM)
    for i, hyps in enumerate(result.hypotheses):
        for h in hyps:
            tgt_in = torch.tensor([[BOS_ID, *h.tokens]])
            tgt_out = torch.tensor(h.tokens + ([EOS_ID] if h.finished else []))
            with torch.no_grad():
                out = model(src[i : i + 1, : lens[i]], lens[i : i + 1], tgt_in)
                T = out.logits.size(1)
                lp = mixture_log_probs(
                    out.logits[0], out.gate[0], out.attention[0], out.src.expand(T, -1)
                )[: tgt_out.numel()]
            expected = float(lp.gather(1, tgt_out.unsqueeze(1)).sum())
            assert h.logprob == pytest.approx(expected, abs=1e-4)


def test_copy_model_outputs_a_gate_and_a_model_without_copy_none():
    src, lens, tgt = batch(SHAPES)
    with torch.no_grad():
        plain = make_model().eval()(src, lens, tgt)
        copying = make_model(copy=True).eval()(src, lens, tgt)
    assert plain.gate is None and plain.copied is None
    assert copying.gate is not None and copying.gate.shape == tgt.shape
    assert ((copying.copied > 0) & (copying.copied < 1)).all()
    # The same seed builds the same weights but the gate's: copy adds, changes nothing else.
    assert torch.equal(plain.logits, copying.logits)


def test_copy_needs_a_joint_vocabulary():
    with pytest.raises(NmtError, match="model.copy: needs tokenizer.joint"):
        config_from_dict({"model": {"copy": True}, "tokenizer": {"joint": False}})


def test_a_copy_checkpoint_translates_and_shows_what_it_copied(tiny_copy_run, tmp_path):
    from nmt.display import format_attention, plot_attention
    from nmt.translate import Translator

    translator = Translator.from_checkpoint(tiny_copy_run.run_dir)
    sentences = tiny_copy_run.train_src[:4]
    for beam in (1, 3):
        for t in translator.translate(sentences, beam=beam):
            assert t.copied is not None and len(t.copied) == len(t.tgt_labels)
            assert all(0.0 < c < 1.0 for c in t.copied)
            table = format_attention(t).splitlines()
            assert table[0].endswith("| copy") and all(" | " in row for row in table[1:])
    plot_attention(t, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    # An ensemble of the model with itself: the same outputs and copy shares.
    pair = Translator.from_checkpoint([tiny_copy_run.checkpoint, tiny_copy_run.run_dir])
    alone = translator.translate(sentences, beam=3)
    for a, b in zip(alone, pair.translate(sentences, beam=3), strict=True):
        assert a.text == b.text
        assert a.copied == pytest.approx(b.copied, abs=1e-5)


def test_a_model_without_copy_shows_no_copy_column(tiny_run):
    from nmt.display import format_attention
    from nmt.translate import Translator

    (t,) = Translator.from_checkpoint(tiny_run.run_dir).translate(tiny_run.train_src[:1])
    assert t.copied is None and "copy" not in format_attention(t)


def test_the_api_answers_copy_per_target_piece(tiny_copy_run):
    from fastapi.testclient import TestClient

    from nmt.serve import create_app
    from nmt.translate import Translator

    translator = Translator.from_checkpoint(tiny_copy_run.run_dir)
    with TestClient(create_app(translator)) as client:
        r = client.post("/translate", json={"text": tiny_copy_run.train_src[0], "attention": True})
        att = r.json()["translations"][0]["attention"]
        assert len(att["copy"]) == len(att["target"]) == len(att["weights"])
