"""The hand-written decoder loop (nmt.recurrence) gives the step-by-step path's numbers:
outputs, attention and every gradient, for each scorer and both decoders that feed back."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from test_model import PAD, SCORERS, batch, make_model
from torch.utils._python_dispatch import TorchDispatchMode

from nmt import recurrence
from nmt.model import Seq2Seq
from nmt.runtime import autocast
from nmt.step import token_loss

FED_BACK: dict[str, dict[str, Any]] = {
    "bahdanau": {"decoder": "bahdanau"},
    "luong_feeding": {"decoder": "luong", "input_feeding": True},
}
COMBOS = (
    [
        pytest.param({"attention": a, **FED_BACK[s]}, id=f"{a}-{s}")
        for a, s in itertools.product(SCORERS, FED_BACK)
    ]
    + [  # copy attention: its loss reads the attention weights, so their gradient flows back
        pytest.param({"attention": a, "copy": True, **FED_BACK[s]}, id=f"{a}-{s}-copy")
        for a, s in itertools.product(SCORERS, FED_BACK)
    ]
    + [  # the linear attentional output W_c u + b_c (OpenNMT-py's mlp attention), no tanh
        pytest.param(
            {
                "attention": a,
                "attention_output": "linear",
                "copy": copy,
                **FED_BACK["luong_feeding"],
            },
            id=f"{a}-luong_feeding-linear" + ("-copy" if copy else ""),
        )
        for a, copy in [*((a, False) for a in SCORERS), ("concat", True)]
    ]
)
SHAPES = [(5, 6), (3, 4), (7, 2)]  # (source, target) lengths: padding on both sides


def loss_and_grads(
    model: Seq2Seq, fused: bool, precision: str = "fp32"
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.decoder.fused = fused
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # with dropout, both paths draw the same masks
    src, lens, tgt = batch(SHAPES)
    target = torch.roll(tgt, -1, dims=1)  # any target: only the arithmetic is compared
    target[:, 1] = src[:, 0]  # a target piece that copy attention can copy
    with autocast(torch.device("cpu"), precision):  # type: ignore[arg-type]
        out = model(src, lens, tgt)
        logits, weights = out.logits, out.attention
        loss = token_loss(out, target.masked_fill(tgt == PAD, PAD), 0.1)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().float(), weights.detach(), grads


@pytest.mark.parametrize("keys", COMBOS)
def test_the_fused_loop_matches_the_step_by_step_path(keys: dict[str, Any]) -> None:
    assert_fused_matches_step_by_step(make_model(**keys, dropout=0.0).train())


@pytest.mark.parametrize("output", ["tanh", "linear"])
@pytest.mark.parametrize("attention", ["concat", "dot"])
def test_the_fused_loop_drops_the_fed_back_output_as_the_step_by_step_path_does(
    output: str, attention: str
) -> None:
    """model.feed_dropout: the same masks, applied to h̃ where both paths feed it back."""
    keys = {"attention": attention, "attention_output": output, **FED_BACK["luong_feeding"]}
    model = make_model(**keys, dropout=0.3, feed_dropout=True).train()
    assert model.generator.dropout.p == 0.0  # h̃ is dropped once, in the decoder
    assert_fused_matches_step_by_step(model)


def assert_fused_matches_step_by_step(model: Seq2Seq) -> None:
    """Outputs, attention and every gradient, the fused loop against the step-by-step path."""
    want_logits, want_weights, want_grads = loss_and_grads(model, fused=False)
    got_logits, got_weights, got_grads = loss_and_grads(model, fused=True)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_weights, want_weights, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("decoder", FED_BACK)
def test_the_fused_loop_under_bf16_autocast_stays_near_fp32(decoder: str) -> None:
    model = make_model(**FED_BACK[decoder], attention="concat", dropout=0.0).train()
    want_logits, _, want_grads = loss_and_grads(model, fused=False)
    got_logits, _, got_grads = loss_and_grads(model, fused=True, precision="bf16")
    torch.testing.assert_close(got_logits, want_logits, rtol=0.05, atol=0.05)
    for name, want in want_grads.items():
        scale = want.abs().max().clamp(min=1e-3)
        assert (got_grads[name] - want).abs().max() <= 0.05 * scale, name


class _Bf16Ops(TorchDispatchMode):
    """The operators that give bf16 results, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
            self.names.add(func.overloadpacket.__name__)
        return out


@pytest.mark.parametrize("attention", SCORERS)
def test_under_bf16_autocast_the_loop_runs_only_its_weight_products_in_bf16(
    attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's attention products (vᵀσ, the scores, the context) stay float32 under bf16
    autocast: autocast would run them in bf16, casting a (B, S, ·) tensor every step."""
    seen = _Bf16Ops()
    loop_forward = recurrence._Run.forward

    def recorded(*args: Any, **kw: Any) -> Any:
        with seen:
            return loop_forward(*args, **kw)

    monkeypatch.setattr(recurrence._Run, "forward", recorded)
    model = make_model(decoder="luong", input_feeding=True, attention=attention, dropout=0.0)
    model.train().decoder.fused = True
    src, lens, tgt = batch(SHAPES)
    with autocast(torch.device("cpu"), "bf16"):  # type: ignore[arg-type]
        model(src, lens, tgt)
    assert seen.names and seen.names <= {"mm", "addmm", "t", "_to_copy"}, seen.names


def test_without_gradients_the_fused_loop_gives_the_same_outputs() -> None:
    model = make_model(decoder="luong", input_feeding=True, dropout=0.0).eval()
    src, lens, tgt = batch(SHAPES)
    with torch.no_grad():
        fused = model(src, lens, tgt).logits
        model.decoder.fused = False
        plain = model(src, lens, tgt).logits
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)


def test_an_lstm_or_two_layers_take_the_step_by_step_path() -> None:
    for keys in ({"cell": "lstm"}, {"dec_layers": 2}):
        model = make_model(decoder="luong", input_feeding=True, **keys)
        src, lens, tgt = batch(SHAPES)
        logits = model(src, lens, tgt).logits
        logits.sum().backward()  # runs, with nn.LSTM / a 2-layer nn.GRU per step
        assert model.decoder.rnn.weight_hh_l0.grad is not None
