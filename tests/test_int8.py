"""int8 decoding (nmt.int8): which layers are quantized, and what it does to a tiny model's
translations and BLEU (on its own training sentences: a tolerance, not a quality claim)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nmt import int8
from nmt.errors import NmtError
from nmt.evaluate import bleu
from nmt.int8 import (
    MIN_INNER,
    PACKED_OUTPUT_ROWS,
    PACKED_ROWS,
    CellGRU,
    Int8Rows,
    Packed,
    PackedGRU,
    PackedLinear,
    linear,
    packed_linear,
    quantize,
)
from nmt.model import Generator
from nmt.translate import Translator

# oneDNN's packed int8 products (`nmt.int8.Packed`) where nmt takes them: without VNNI they
# may saturate (`packs()`), and nmt keeps fbgemm's there
oneDNN_int8 = pytest.mark.skipif(
    not int8.packs(), reason="no oneDNN int8 product with AVX512-VNNI here (nmt keeps fbgemm)"
)

# How far int8 may move the tiny model's BLEU on its training sentences, in points: its
# weights' rounding changes a few near-tie choices, not what the model learnt.
TOLERANCE = 5.0


@pytest.mark.parametrize("run", ["tiny_run", "tiny_heads_run"])
def test_int8_decoding_stays_within_the_tolerance_of_float32(run, request):
    tiny = request.getfixturevalue(run)
    # all of its training sentences: at a tiny model's BLEU (about 5), 24 of them moved by
    # 6 points with a handful of changed choices (48: 0.4), which the test is not about
    sentences, refs = tiny.train_src, tiny.train_tgt
    full = Translator.from_checkpoint(tiny.run_dir)
    int8 = Translator.from_checkpoint(tiny.run_dir, int8=True)
    for beam in (1, 3):
        want = [t.text for t in full.translate(sentences, beam=beam)]
        got = int8.translate(sentences, beam=beam)
        assert abs(bleu([t.text for t in got], refs).score - bleu(want, refs).score) <= TOLERANCE
        assert sum(g.text == w for g, w in zip(got, want, strict=True)) >= len(want) // 2


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=oneDNN_int8)])
def test_rnns_and_linear_layers_are_quantized_and_the_output_layer_gets_int8_rows(
    tiny_copy_run, packed, monkeypatch
):
    monkeypatch.setattr(int8, "packs", lambda: packed)
    model = Translator.from_checkpoint(tiny_copy_run.run_dir, int8=True).model
    plain = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.GRU))}
    narrow = {
        n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.out_features == 1
    }
    assert narrow  # the copy gate at least: a few dot products a row, kept float
    # every other product layer now holds int8 weights
    assert set(plain) == {"generator.out"} | narrow
    # the decoder's GRU as a quantized cell (`CellGRU`), and on oneDNN's packed products as
    # well where they are taken; the encoder's as PyTorch quantizes it
    rnn = model.decoder.rnn
    if packed:
        assert isinstance(rnn, PackedGRU) and isinstance(rnn.w_ih, Packed)
        assert isinstance(model.decoder.attention.key_proj, PackedLinear)
        rnn = rnn.small
    assert isinstance(rnn, CellGRU)
    assert type(rnn.cell).__module__.startswith("torch.ao.nn.quantized.dynamic")
    assert type(model.encoder.rnn).__module__.startswith("torch.ao.nn.quantized.dynamic")
    rows = model.generator.out_packed
    assert rows is not None and rows.weight.dtype == torch.int8
    assert rows.weight.shape == model.generator.out.weight.shape


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("given_h0", [True, False])
def test_a_quantized_cell_gru_is_the_quantized_gru_bit_for_bit(steps, given_h0):
    """int8 decoding runs a decoder's GRU as a quantized GRUCell (`CellGRU`): the numbers of
    the quantized nn.GRU it replaces run a step at a time, as a search runs it, exactly (over
    several steps at once the quantized nn.GRU quantizes all their inputs with one scale)."""
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    gru = nn.GRU(12, 8, batch_first=True).eval()
    ref = quantize_dynamic(nn.Sequential(gru), {nn.GRU}, inplace=False)[0]
    mine = quantize_dynamic(nn.Sequential(CellGRU(gru)), {nn.GRUCell}, inplace=False)[0]
    assert type(mine.cell).__module__.startswith("torch.ao.nn.quantized.dynamic")
    x = torch.randn(5, steps, 12)
    h0 = torch.randn(1, 5, 8) if given_h0 else None
    with torch.inference_mode():
        outs, want_h = [], h0
        for t in range(steps):
            out, want_h = ref(x[:, t : t + 1], want_h)
            outs.append(out)
        want_out = torch.cat(outs, dim=1)
        got_out, got_h = mine(x, h0)
        float_out, _ = gru(x, h0)
    assert torch.equal(got_out, want_out) and torch.equal(got_h, want_h)
    assert got_out.shape == (5, steps, 8) and got_h.shape == (1, 5, 8)
    torch.testing.assert_close(got_out, float_out, atol=0.05, rtol=0.05)  # and a GRU's


def _bound(x: torch.Tensor, w: torch.Tensor, q: Int8Rows) -> torch.Tensor:
    """The most rounding can move each x·wᵀ (x (M, K), w (N, K)): half a step of each
    operand's scale, times the other operand's magnitudes, summed over K."""
    sx = x.abs().amax(dim=1, keepdim=True) / 127  # (M, 1)
    w_hat = q.weight.float() * q.scale.unsqueeze(1)  # (N, K)
    return (x.abs() @ (q.scale.unsqueeze(1) / 2).expand_as(w).t()) + sx / 2 * w_hat.abs().sum(1)


def test_int8_rows_product_is_within_its_rounding_bound():
    torch.manual_seed(0)
    x, w, b = torch.randn(37, 96), torch.randn(301, 96) * 0.1, torch.randn(301)
    q = Int8Rows.of(w)
    got, want = linear(x, q, b), x @ w.t() + b  # (37, 301)
    assert got.dtype == torch.float32
    err = (got - want).abs()
    assert (err <= _bound(x, w, q) * 1.001 + 1e-5).all()
    assert err.max() > 0  # rounding did happen: the bound, not equality, is what held
    # leading dimensions, bf16 input (cast to float32 first), no bias
    got3 = linear(x.view(37, 1, 96).bfloat16(), q, None)
    assert got3.shape == (37, 1, 301)
    assert torch.allclose(got3.view(37, 301), linear(x.bfloat16().float(), q, None))


def _tensor_bound(x: torch.Tensor, q: Int8Rows) -> torch.Tensor:
    """`_bound` for an input quantized per tensor, asymmetric (u8: one step for the range
    from min(x, 0) to max(x, 0), a zero point), as oneDNN's product quantizes it."""
    sx = (x.max().clamp(min=0) - x.min().clamp(max=0)) / 255  # the input's step
    w_hat = q.weight.float() * q.scale.unsqueeze(1)  # (N, K)
    return x.abs() @ (q.scale / 2).unsqueeze(0).expand(x.size(1), -1) + sx / 2 * w_hat.abs().sum(1)


@oneDNN_int8
@pytest.mark.parametrize("rows", [37, 48, 64])  # padded to 48, a bucket already, and one
def test_packed_product_is_within_its_rounding_bound(rows):
    """oneDNN's product quantizes its input per tensor, asymmetric (u8: one scale for the
    range from min(x, 0) to max(x, 0), a zero point), the weight per row like `Int8Rows`."""
    torch.manual_seed(3)
    x, w, b = torch.randn(rows, 96) + 0.5, torch.randn(301, 96) * 0.1, torch.randn(301)
    q = Int8Rows.of(w)
    got, want = packed_linear(x, q.packed, b), x @ w.t() + b  # (rows, 301)
    assert got.shape == (rows, 301) and got.dtype == torch.float32
    err = (got - want).abs()
    assert (err <= _tensor_bound(x, q) * 1.001 + 1e-4).all() and err.max() > 0
    # leading dimensions, a bf16 input (autocast's), no bias: the same rows' products
    lead = packed_linear(x.view(rows, 1, 96).bfloat16(), q.packed, None)
    assert lead.shape == (rows, 1, 301)
    torch.testing.assert_close(
        lead.view(rows, 301) + b, packed_linear(x.bfloat16().float(), q.packed, b)
    )


@oneDNN_int8
@pytest.mark.parametrize("batch", [PACKED_ROWS - 1, PACKED_ROWS, 70])
def test_packed_gru_and_linear_take_onednn_from_packed_rows_on(batch, monkeypatch):
    """Below `PACKED_ROWS` rows fbgemm's quantized layers (`small`) run, from there on
    oneDNN's packed products: both within int8's rounding of the float layers."""
    torch.manual_seed(4)
    gru, layer = nn.GRU(24, 16, batch_first=True).eval(), nn.Linear(24, 40).eval()
    pgru, plin = PackedGRU(gru), PackedLinear(layer)
    calls: list[str] = []
    monkeypatch.setattr(
        int8, "packed_linear", lambda *a: calls.append("onednn") or packed_linear(*a)
    )
    x, h0 = torch.randn(batch, 2, 24), torch.randn(1, batch, 16)
    with torch.inference_mode():
        want_out, want_h = gru(x, h0)
        got_out, got_h = pgru(x, h0)
        want_y, got_y = layer(x[:, :1]), plin(x[:, :1])  # (batch, 1, 40)
    assert got_out.shape == want_out.shape and got_h.shape == want_h.shape
    torch.testing.assert_close(got_out, want_out, atol=0.05, rtol=0.05)
    torch.testing.assert_close(got_h, want_h, atol=0.05, rtol=0.05)
    torch.testing.assert_close(got_y, want_y, atol=0.05, rtol=0.05)
    # the input's products (one for both steps), each step's state's, the Linear layer's
    assert calls == ([] if batch < PACKED_ROWS else ["onednn"] * 4)


@oneDNN_int8
def test_int8_rows_product_takes_the_packed_rows_from_packed_output_rows_on(monkeypatch):
    """An output layer's product packs its rows once, at its first call of
    `PACKED_OUTPUT_ROWS` rows or more, and runs on them from then on; below, per-row int8."""
    monkeypatch.setattr(int8, "packs", lambda: True)
    torch.manual_seed(5)
    w, b = torch.randn(300, 64) * 0.1, torch.randn(300)
    q = Int8Rows.of(w)
    small, large = torch.randn(PACKED_OUTPUT_ROWS - 1, 64), torch.randn(PACKED_OUTPUT_ROWS, 64)
    got_small = linear(small, q, b)
    assert "packed" not in vars(q)  # not packed for the smaller call
    torch.testing.assert_close(got_small, _per_row(small, q, b), rtol=1e-5, atol=1e-5)
    got = linear(large, q, b)
    assert vars(q)["packed"] is q.packed  # packed once, kept
    assert torch.equal(got, packed_linear(large, q.packed, b))
    err = (got - (large @ w.t() + b)).abs()
    assert (err <= _tensor_bound(large, q) * 1.001 + 1e-4).all()


def _per_row(x: torch.Tensor, q: Int8Rows, bias: torch.Tensor) -> torch.Tensor:
    """`linear`'s per-row product, written out (the same up to float32 rounding; a product
    quantized otherwise differs by int8's steps, about 1e-3 here)."""
    xq = Int8Rows.of(x)
    acc = (xq.weight.long() @ q.weight.long().t()).float()  # exact int sums
    return acc * xq.scale.unsqueeze(1) * q.scale + bias


def test_int8_rows_product_is_exact_where_nothing_rounds():
    """Integer rows whose largest magnitude is 127 have scale 1: the int8 sums are exact."""
    torch.manual_seed(1)
    x = torch.randint(-127, 128, (9, 40)).float()
    w = torch.randint(-127, 128, (50, 40)).float()
    x[:, 0], w[:, 0] = 127, -127  # every row's largest magnitude
    b = torch.arange(50.0)
    assert torch.equal(linear(x, Int8Rows.of(w), b), x @ w.t() + b)


def test_int8_rows_cut_like_the_float_weight():
    w = torch.randn(64, 16)
    q, index = Int8Rows.of(w), torch.tensor([3, 9, 10, 63])
    cut = q.rows(index)
    assert torch.equal(cut.weight, Int8Rows.of(w[index]).weight)
    assert torch.equal(cut.scale, Int8Rows.of(w[index]).scale)


def test_a_zero_row_gives_the_bias_not_nan():
    q = Int8Rows.of(torch.zeros(5, 16))
    out = linear(torch.zeros(2, 16), q, torch.ones(5))
    assert torch.equal(out, torch.ones(2, 5))


def test_output_layers_narrower_than_min_inner_stay_float():
    """torch._int_mm sums wrongly for an inner size of 1; narrow layers keep float."""
    model = nn.Module()
    model.generator = Generator(input_size=MIN_INNER - 1, vocab_size=20, dropout=0.0, tie_to=None)
    quantize(model, "cpu")
    assert model.generator.out_packed is None
    model.generator = Generator(input_size=MIN_INNER, vocab_size=20, dropout=0.0, tie_to=None)
    quantize(model, "cpu")
    assert model.generator.out_packed is not None


def test_int8_shortlisted_scores_stay_within_the_bound_of_float_ones(tiny_run):
    """An int8 model's output layer cut to a batch's columns (what a shortlist gives it),
    against the float layer: within the rounding bound, and the same as the whole
    vocabulary's int8 scores at those columns."""
    gen = Translator.from_checkpoint(tiny_run.run_dir, int8=True).model.generator
    assert gen.out_packed is not None
    torch.manual_seed(2)
    x = torch.randn(6, gen.out.in_features if gen.proj is None else gen.proj.in_features)
    h = x if gen.proj is None else gen.proj(x)  # (6, E) what the output layer reads
    columns = torch.tensor([2, 3, 5, 8, 13])
    vocab = gen.restrict(columns)
    assert isinstance(vocab.weight, Int8Rows)
    want = h @ gen.out.weight[columns].t() + gen.out.bias[columns]
    got = gen(x, vocab)  # (6, 5)
    bound = _bound(h, gen.out.weight[columns], vocab.weight)
    assert ((got - want).abs() <= bound * 1.001 + 1e-5).all()
    full = gen(x)  # (6, V): the whole vocabulary in int8 too
    assert torch.allclose(full[:, columns], got)


def test_int8_is_refused_off_the_cpu():
    with pytest.raises(NmtError, match="--int8: CPU decoding only"):
        quantize(nn.Linear(2, 2), "cuda")


def test_translate_int8_prints_the_translation_and_no_warnings(tiny_run):
    from test_cli import runner

    from nmt.cli import app

    sentence = tiny_run.train_src[0]
    args = ["translate", sentence, "--model", str(tiny_run.run_dir), "--device", "cpu"]
    result = runner.invoke(app, [*args, "--int8"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and result.stderr == ""
