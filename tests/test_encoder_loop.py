"""The hand-written encoder (nmt.encoder_loop) gives nn.GRU's numbers over a packed sequence:
states, final states and every gradient, in float32 and under bf16 autocast; and the model
takes it exactly where it applies. The same for its one-direction use in the Luong decoder
without input feeding (`decoder_gru`), from a given first state."""

from __future__ import annotations

import pytest
import torch
from test_model import batch, make_model
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import nmt.decoder
import nmt.model
from nmt.encoder_loop import applies, decoder_applies, decoder_gru, encoder_loop
from nmt.runtime import autocast
from nmt.step import token_loss

LENGTHS = [
    [7, 7, 5, 3, 3, 1],  # ties, a one-piece row, rows finishing at different steps
    [4],  # one row
    [6, 6, 6],  # no padding
]


def reference(rnn: nn.GRU, emb: torch.Tensor, lens: torch.Tensor):
    packed = pack_padded_sequence(emb, lens, batch_first=True)
    out, final = rnn(packed)
    states, _ = pad_packed_sequence(out, batch_first=True, total_length=emb.size(1))
    return states, final


def run(fn, rnn: nn.GRU, emb: torch.Tensor, lens: torch.Tensor, precision: str):
    """Outputs and gradients of a loss that reads the states and the final states (each
    position and row weighted differently, so a misplaced gradient shows)."""
    rnn.zero_grad(set_to_none=True)
    emb = emb.clone().requires_grad_(True)
    with autocast(torch.device("cpu"), precision):  # type: ignore[arg-type]
        states, final = fn(rnn, emb, lens)
    g = torch.Generator().manual_seed(3)
    w_states = torch.randn(states.shape, generator=g)
    w_final = torch.randn(final.shape, generator=g)
    loss = (states.float() * w_states).sum() + (final.float() * w_final).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in rnn.named_parameters()}
    assert emb.grad is not None
    return states.detach().float(), final.detach().float(), emb.grad, grads


@pytest.mark.parametrize("lengths", LENGTHS, ids=["ragged", "one-row", "full"])
def test_same_numbers_as_packed_gru(lengths: list[int]) -> None:
    torch.manual_seed(0)
    rnn = nn.GRU(5, 4, batch_first=True, bidirectional=True)
    lens = torch.tensor(lengths)
    emb = torch.randn(len(lengths), max(lengths), 5)
    assert applies(rnn, emb, lens)
    got = run(encoder_loop, rnn, emb, lens, "fp32")
    want = run(reference, rnn, emb, lens, "fp32")
    for a, b in zip(got[:3], want[:3], strict=True):  # the same arithmetic in another order
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (got[0][lens.unsqueeze(1) <= torch.arange(emb.size(1))] == 0).all()  # padding
    assert got[3].keys() == want[3].keys()
    for name in want[3]:
        torch.testing.assert_close(got[3][name], want[3][name], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("lengths", LENGTHS, ids=["ragged", "one-row", "full"])
def test_bf16_no_less_accurate_than_packed_gru(lengths: list[int]) -> None:
    """Under bf16 autocast both round the products' inputs; nn.GRU also sums each weight's
    gradient over the steps in bf16, the loop in one float32-accumulated product. Against
    float32, the loop's error is at most 1.5 times nn.GRU's own (here it is 0.1-0.9 times)."""
    torch.manual_seed(0)
    rnn = nn.GRU(5, 4, batch_first=True, bidirectional=True)
    lens = torch.tensor(lengths)
    emb = torch.randn(len(lengths), max(lengths), 5)
    exact = run(reference, rnn, emb, lens, "fp32")
    got = run(encoder_loop, rnn, emb, lens, "bf16")
    want = run(reference, rnn, emb, lens, "bf16")

    def error(result, i: int, name: str = "") -> float:
        a, b = (result[i][name], exact[i][name]) if name else (result[i], exact[i])
        return float((a - b).abs().max() / b.abs().max())

    for i in range(3):
        assert error(got, i) <= 1.5 * error(want, i), i
    for name in exact[3]:
        assert error(got, 3, name) <= 1.5 * error(want, 3, name), name


def test_applies_only_where_it_computes_the_same() -> None:
    rnn = nn.GRU(5, 4, batch_first=True, bidirectional=True)
    emb, lens = torch.randn(3, 4, 5), torch.tensor([4, 3, 2])
    assert applies(rnn, emb, lens)
    assert not applies(rnn, emb, torch.tensor([3, 4, 2]))  # unsorted: nn.GRU sorts
    assert not applies(rnn, emb, torch.tensor([4, 3, 0]))  # empty row: nn.GRU refuses it
    with torch.no_grad():  # decoding: nothing to save, nn.GRU's own loop
        assert not applies(rnn, emb, lens)
    assert not applies(nn.LSTM(5, 4, batch_first=True, bidirectional=True), emb, lens)
    assert not applies(nn.GRU(5, 4, num_layers=2, batch_first=True, bidirectional=True), emb, lens)
    assert not applies(nn.GRU(5, 4, batch_first=True, bidirectional=True, bias=False), emb, lens)


def counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """`module.name` replaced by itself counting its calls: the list they are counted in."""
    calls: list[int] = []
    fn = getattr(module, name)

    def counted(*args):
        calls.append(1)
        return fn(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_model_takes_it_and_learns_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole model's loss and gradients with the encoder's loop and with nn.GRU."""
    calls = counting(monkeypatch, nmt.model, "encoder_loop")
    results = []
    for fused in (True, False):
        torch.manual_seed(0)
        model = make_model(attention="concat", cell="gru")
        model.encoder.fused = fused
        src, lens, tgt = batch([(5, 6), (3, 4), (7, 2)])
        order = torch.argsort(lens, descending=True)  # as collate sorts them
        src, lens, tgt = src[order], lens[order], tgt[order]
        logits = model(src, lens, tgt).logits
        loss = logits.float().log_softmax(-1).mean()
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    assert len(calls) == 1  # the fused model's encoder, not the other
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    assert any(n.startswith("encoder.") for n in grads_a)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-6, rtol=1e-5, msg=name)


def run_decoder(fn, rnn: nn.GRU, emb: torch.Tensor, h0: torch.Tensor, precision: str):
    """States and the gradients of emb, h0 and every weight for a loss weighting each
    position and row differently."""
    rnn.zero_grad(set_to_none=True)
    emb, h0 = emb.clone().requires_grad_(True), h0.clone().requires_grad_(True)
    with autocast(torch.device("cpu"), precision):  # type: ignore[arg-type]
        states = fn(rnn, emb, h0)
    w = torch.randn(states.shape, generator=torch.Generator().manual_seed(3))
    (states.float() * w).sum().backward()
    assert emb.grad is not None and h0.grad is not None
    grads = {n: p.grad.clone() for n, p in rnn.named_parameters()}
    return [states.detach().float(), emb.grad.float(), h0.grad.float()], grads


def gru_states(rnn: nn.GRU, emb: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    return rnn(emb, h0)[0]


def test_decoder_gru_gives_nn_grus_numbers_from_a_given_state() -> None:
    """The Luong decoder without input feeding: one direction, from the bridge's state, whose
    gradient flows back too."""
    torch.manual_seed(0)
    rnn = nn.GRU(5, 4, batch_first=True)
    emb, h0 = torch.randn(3, 6, 5), torch.randn(1, 3, 4)
    assert decoder_applies(rnn, emb)
    got, got_w = run_decoder(decoder_gru, rnn, emb, h0, "fp32")
    want, want_w = run_decoder(gru_states, rnn, emb, h0, "fp32")
    assert got_w.keys() == want_w.keys()
    for a, b in zip([*got, *got_w.values()], [*want, *want_w.values()], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_decoder_gru_applies_only_where_it_computes_the_same() -> None:
    emb = torch.randn(3, 4, 5)
    assert decoder_applies(nn.GRU(5, 4, batch_first=True), emb)
    with torch.no_grad():  # decoding runs a step at a time anyway
        assert not decoder_applies(nn.GRU(5, 4, batch_first=True), emb)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # nn.GRU's products are oneDNN's there
        assert not decoder_applies(nn.GRU(5, 4, batch_first=True), emb)
    assert not decoder_applies(nn.GRU(5, 4, batch_first=True, bidirectional=True), emb)
    assert not decoder_applies(nn.GRU(5, 4, num_layers=2, batch_first=True), emb)
    assert not decoder_applies(nn.GRU(5, 4, batch_first=True, bias=False), emb)
    assert not decoder_applies(nn.LSTM(5, 4, batch_first=True), emb)


@pytest.mark.parametrize("copy", [False, True])
def test_the_luong_decoder_without_feeding_takes_it_and_learns_the_same(
    copy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The everyday model's decoder (Luong, no input feeding, a linear bridge, copy
    attention): logits and every gradient, the bridge's included, with `decoder_gru` and
    with nn.GRU."""
    calls = counting(monkeypatch, nmt.decoder, "decoder_gru")
    results = []
    for fused in (True, False):
        model = make_model(
            attention="bilinear", decoder="luong", input_feeding=False, bridge="linear", copy=copy
        )
        model.decoder.fused = fused
        src, lens, tgt = batch([(5, 6), (3, 4), (7, 2)])
        out = model(src, lens, tgt)
        token_loss(out, torch.roll(tgt, -1, 1), 0.1).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), grads))
    assert len(calls) == 1
    (logits_a, grads_a), (logits_b, grads_b) = results
    torch.testing.assert_close(logits_a, logits_b)
    assert grads_a.keys() == grads_b.keys() and any(n.startswith("bridge.") for n in grads_a)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-6, rtol=1e-5, msg=name)
