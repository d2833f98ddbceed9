"""`nmt.vml.tanh`: tanh's numbers as 2σ(2x) − 1 where ATen's tanh is MKL's slow path, torch's
own tanh everywhere else; and the hand-written loops and the GRU cell that take it give the
reference paths' numbers with the sigmoid form forced on every tensor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import test_encoder_loop as encoder_tests  # its tests run here again, not collected twice
import torch
from test_model import make_model
from test_recurrence import assert_fused_matches_step_by_step
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nmt import vml
from nmt.gru_cell import gru_gates


class _Ops(TorchDispatchMode):
    """The names of the operators run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def sigmoid_form(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The sigmoid form for every float32 CPU tensor, whatever the CPU and its size."""
    monkeypatch.setattr(vml, "TANH_FAST", False)
    monkeypatch.setattr(vml, "SIGMOID_FORM_FROM", 0)
    yield


def values() -> torch.Tensor:
    """(64, 512): a decoder step's gates; values near 0, moderate and saturating."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=g) * 3
    x[0] = torch.linspace(-1e-3, 1e-3, 512)
    x[1] = torch.linspace(-40, 40, 512)
    return x


def test_the_sigmoid_form_is_tanh_in_place_into_out_and_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vml, "TANH_FAST", False)
    x = values()
    assert x.numel() >= vml.SIGMOID_FORM_FROM
    want = torch.tanh(x)
    for into in ("new", "out", "self"):
        y = x.clone()
        out = {"new": None, "out": torch.empty_like(x), "self": y}[into]
        with _Ops() as ops:
            got = vml.tanh(y, out=out)
        assert "sigmoid_.default" in ops.names and "tanh.default" not in ops.names
        assert out is None or got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got, want, rtol=0, atol=2e-7)
        assert got.abs().max() <= 1


@pytest.mark.parametrize("case", ["fast", "small", "bf16", "autograd"])
def test_torch_tanh_itself_elsewhere(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where MKL's tanh is fast, below the size where the form pays, in half precision, and
    for a tensor recording its gradient (tanh's backward reads tanh's own output)."""
    monkeypatch.setattr(vml, "TANH_FAST", case == "fast")
    x = values()
    if case == "small":
        x = x[:1, : vml.SIGMOID_FORM_FROM // 2]
    if case == "bf16":
        x = x.bfloat16()
    if case == "autograd":
        x.requires_grad_(True)
    with _Ops() as ops:
        got = vml.tanh(x)
    assert "tanh.default" in ops.names and "sigmoid_.default" not in ops.names
    assert torch.equal(got.detach(), torch.tanh(x.detach()))
    if case == "autograd":
        got.sum().backward()
        assert x.grad is not None
        torch.testing.assert_close(x.grad, 1 - torch.tanh(x.detach()) ** 2)


def test_gru_gates_give_the_gru_cells_state(sigmoid_form: None) -> None:
    """The gates decoding's GRU step runs (`StepGRU`: int8's and bf16's) and the loops use."""
    torch.manual_seed(0)
    cell = nn.GRUCell(6, 5)
    x, h = torch.randn(4, 6) * 2, torch.randn(4, 5)
    with torch.no_grad():
        gi = x @ cell.weight_ih.t() + cell.bias_ih
        gh = h @ cell.weight_hh.t() + cell.bias_hh
        with _Ops() as ops:
            got = gru_gates(gi, gh, h, {})
        want = cell(x, h)
    assert "sigmoid_.default" in ops.names and "tanh.default" not in ops.names
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "keys",
    [
        {"decoder": "luong", "input_feeding": True, "attention": "concat"},  # tanh output
        {"decoder": "luong", "input_feeding": True, "attention": "dot", "copy": True},
        {"decoder": "bahdanau", "attention": "general"},
    ],
    ids=["luong-tanh-concat", "luong-tanh-dot-copy", "bahdanau"],
)
def test_the_decoder_loop_with_the_form_matches_the_step_by_step_path(
    keys: dict[str, Any], sigmoid_form: None
) -> None:
    """The loop takes the form (no autograd inside it); the step-by-step path records torch's
    tanh: outputs, attention and every gradient alike."""
    assert_fused_matches_step_by_step(make_model(**keys, dropout=0.0).train())


@pytest.mark.parametrize("lengths", encoder_tests.LENGTHS, ids=["ragged", "one-row", "full"])
def test_the_encoder_loop_with_the_form_gives_nn_grus_numbers(
    lengths: list[int], sigmoid_form: None
) -> None:
    encoder_tests.test_same_numbers_as_packed_gru(lengths)


def test_the_decoder_gru_with_the_form_gives_nn_grus_numbers(sigmoid_form: None) -> None:
    encoder_tests.test_decoder_gru_gives_nn_grus_numbers_from_a_given_state()
