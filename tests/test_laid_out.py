"""bf16 decoding on weights laid out once (nmt.laid_out): each laid-out layer computes its
float layer to bf16's rounding, exactly the layers int8 quantizes are laid out, the model
runs outside autocast, and a tiny model's translations stay within a tolerance of float32's
(on its own training sentences: a tolerance, not a quality claim)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_search import COMBOS, random_batch, tiny_model
from torch import nn

from nmt import laid_out
from nmt.evaluate import bleu
from nmt.int8 import decoding_layers
from nmt.tokenizer import BOS_ID
from nmt.translate import Translator

pytestmark = pytest.mark.skipif(
    not laid_out.applies("cpu", "bf16"),
    reason="bf16 laid-out decoding needs oneDNN and a CPU with bf16 units (AVX512-BF16 or AMX)",
)

# bf16 keeps 8 significant bits: a product of n terms of magnitude ~1 moves by ~n·2⁻⁹ at most
RTOL, ATOL = 2e-2, 2e-2
TOLERANCE = 5.0  # BLEU points on the tiny model's training sentences, as for int8


def _bf16_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x Wᵀ + b with both operands rounded to bf16 as the laid-out product takes them, summed
    in float32."""
    y = x.bfloat16().float() @ w.bfloat16().float().t()
    return y if b is None else y + b.bfloat16().float()


@pytest.mark.parametrize("bias", [True, False])
def test_laid_out_linear_computes_the_layer_in_bf16(bias):
    torch.manual_seed(0)
    layer = nn.Linear(96, 200, bias=bias)
    laid = laid_out.LaidOutLinear(layer)
    for shape in [(37, 96), (5, 3, 96), (1, 96)]:
        x = torch.randn(shape)
        got = laid(x)
        assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 200)
        want = _bf16_reference(x.reshape(-1, 96), layer.weight, layer.bias).view_as(got)
        # the output is rounded to bf16 once more (oneDNN writes bf16): half a bf16 step
        assert torch.allclose(got, want, rtol=2**-8, atol=1e-3)
        assert torch.allclose(got, layer(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("with_h0", [True, False])
def test_laid_out_gru_follows_nn_gru(steps, with_h0):
    torch.manual_seed(1)
    gru = nn.GRU(48, 32, batch_first=True)
    laid = laid_out.LaidOutGRU(gru)
    x = torch.randn(6, steps, 48)
    h0 = torch.randn(1, 6, 32) if with_h0 else None
    out, h = laid(x, h0)
    want_out, want_h = gru(x, h0)
    assert out.shape == want_out.shape and h.shape == want_h.shape
    assert out.dtype == torch.float32
    assert torch.allclose(out, want_out.detach(), rtol=RTOL, atol=ATOL)
    assert torch.equal(h[0], out[:, -1])
    # the gates themselves are float32: bf16's rounding is in the two products only
    assert (out - want_out.detach()).abs().max() > 0


@pytest.mark.parametrize("copy_attention", [False, True], ids=["", "copy"])
@pytest.mark.parametrize("attention, decoder, feed", COMBOS)
def test_a_laid_out_model_steps_like_the_float_one(attention, decoder, feed, copy_attention):
    """Every scorer and decoder: a few decoding steps' scores and attention, laid out against
    float32, the same previous tokens fed to both."""
    model = tiny_model(attention, decoder, feed, copy=copy_attention)
    laid = laid_out.lay_out(copy.deepcopy(model))
    assert any(isinstance(m, laid_out.LaidOutGRU) for m in laid.modules())
    _assert_steps_alike(model, laid, [6, 4, 3], steps=4)


def _assert_steps_alike(model: nn.Module, laid: nn.Module, lens: list[int], steps: int) -> None:
    """`steps` greedy decoding steps of `laid` against `model` on random sources of `lens`,
    the same previous tokens fed to both: scores and attention within bf16's tolerance."""
    src, src_lens = random_batch(lens)
    with torch.inference_mode():
        enc_f, enc_l = model.encode(src, src_lens), laid.encode(src, src_lens)
        state_f, state_l = model.init_state(enc_f), laid.init_state(enc_l)
        prev = torch.full((len(lens),), BOS_ID)
        for _ in range(steps):
            scores_f, state_f, attn_f = model.step(prev, state_f, enc_f)
            scores_l, state_l, attn_l = laid.step(prev, state_l, enc_l)
            assert scores_l.dtype == torch.float32
            assert torch.allclose(scores_l, scores_f, rtol=RTOL, atol=5 * ATOL)
            assert torch.allclose(attn_l, attn_f, rtol=RTOL, atol=ATOL)
            prev = scores_f.argmax(-1)


@pytest.mark.parametrize(
    "kw",
    [{"cell": "lstm"}, {"dec_layers": 2, "enc_layers": 2}, {"attention_heads": 2}],
    ids=["lstm", "two-layers", "two-heads"],
)
def test_other_models_decode_with_what_is_laid_out_and_the_rest_in_float32(kw):
    """LSTMs and several-layer GRUs stay as they are (float32: the model runs outside
    autocast) beside laid-out Linear layers; several heads' projections are laid out. Their
    decoding steps follow the float model's."""
    model = tiny_model("general", "luong", True, **kw)
    laid = laid_out.lay_out(copy.deepcopy(model))
    kept = "attention_heads" not in kw  # the decoder's RNN: an LSTM or two layers
    assert isinstance(laid.decoder.rnn, laid_out.LaidOutGRU) != kept
    assert any(isinstance(m, laid_out.LaidOutLinear) for m in laid.modules())
    _assert_steps_alike(model, laid, [5, 5, 2], steps=3)


def test_the_layers_int8_quantizes_are_laid_out_and_the_output_layer_gets_bf16_rows(
    tiny_copy_run,
):
    tr = Translator.from_checkpoint(tiny_copy_run.run_dir, precision="bf16")
    model = tr.model
    assert tr.autocast_precision == "fp32"  # its products cast themselves
    plain = Translator.from_checkpoint(tiny_copy_run.run_dir).model
    names = decoding_layers(plain)
    replaced = {n for n, m in model.named_modules() if type(m).__module__ == laid_out.__name__}
    # every such layer but the bidirectional encoder GRU, which stays as it is (see
    # nmt.laid_out)
    assert replaced == names - {"encoder.rnn"} and "decoder.rnn" in replaced
    assert type(model.encoder.rnn) is nn.GRU and model.encoder.rnn.bidirectional
    rows = model.generator.out_packed
    assert isinstance(rows, laid_out.LaidOut) and rows.weight.dtype == torch.bfloat16
    assert rows.weight.shape == model.generator.out.weight.shape


def test_int8_wins_over_laying_out(tiny_run):
    tr = Translator.from_checkpoint(tiny_run.run_dir, precision="bf16", int8=True)
    assert not any(type(m).__module__ == laid_out.__name__ for m in tr.model.modules())
    assert tr.autocast_precision == "bf16"


def test_shortlisted_scores_are_the_whole_vocabularys_at_those_columns(tiny_run):
    gen = Translator.from_checkpoint(tiny_run.run_dir, precision="bf16").model.generator
    torch.manual_seed(2)
    x = torch.randn(6, gen.out.in_features if gen.proj is None else gen.proj.in_features)
    columns = torch.tensor([2, 3, 5, 8, 13])
    vocab = gen.restrict(columns)
    assert isinstance(vocab.weight, laid_out.LaidOut)
    assert vocab.weight.weight.shape == (5, gen.out.in_features)
    got = gen(x, vocab)  # (6, 5)
    assert torch.allclose(gen(x)[:, columns], got)
    h = x if gen.proj is None else gen.proj(x)  # what the output layer reads
    want = h @ gen.out.weight[columns].t() + gen.out.bias[columns]
    assert torch.allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("run", ["tiny_run", "tiny_copy_run"])
def test_laid_out_decoding_stays_within_the_tolerance_of_float32(run, request):
    tiny = request.getfixturevalue(run)
    sentences, refs = tiny.train_src, tiny.train_tgt
    full = Translator.from_checkpoint(tiny.run_dir)
    bf16 = Translator.from_checkpoint(tiny.run_dir, precision="bf16")
    for beam in (1, 3):
        want = [t.text for t in full.translate(sentences, beam=beam)]
        got = bf16.translate(sentences, beam=beam)
        assert abs(bleu([t.text for t in got], refs).score - bleu(want, refs).score) <= TOLERANCE
        assert sum(g.text == w for g, w in zip(got, want, strict=True)) >= len(want) // 2
