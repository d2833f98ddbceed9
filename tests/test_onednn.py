"""Float32 products through oneDNN (nmt.onednn) give torch's own products' numbers, forward
and backward, for every operand layout the loops pass; other layouts, dtypes and autocast
go to torch's own product; the model's Linear layers take them."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest
import torch
from test_model import SCORERS, STYLES, batch, make_model
from torch import nn
from torch.nn import functional as F
from train_setup import ROOT

from nmt import onednn
from nmt.runtime import cpu_has_bf16_matmul
from nmt.search import greedy
from nmt.step import token_loss

pytestmark = pytest.mark.skipif(not onednn.available, reason="this torch has no oneDNN")


@pytest.fixture(autouse=True)
def through_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oneDNN path on whichever CPU runs the tests (an Intel CPU has it off by default)."""
    monkeypatch.setattr(onednn, "enabled", True)


def operands() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 5, generator=g), torch.randn(3, 5, generator=g)
    wide = torch.randn(3, 9, generator=g)
    return {
        "contiguous": (x, w),
        "transposed x": (torch.randn(5, 7, generator=g).t(), w),
        "transposed w": (x, torch.randn(5, 3, generator=g).t()),
        "column slice w": (x, wide[:, 2:7]),  # not dense: torch's own product
    }


@pytest.mark.parametrize("name", list(operands()))
def test_linear_equals_torch(name: str) -> None:
    x, w = operands()[name]
    b = torch.randn(3)
    torch.testing.assert_close(onednn.linear(x, w, b), F.linear(x, w, b))
    torch.testing.assert_close(onednn.linear(x, w), x @ w.t())
    torch.testing.assert_close(onednn.mm(x, w.t()), x @ w.t())
    assert onednn.dense(w) == (name != "column slice w")


def test_linear_layer_gradients_equal_torch() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 6, generator=g)
    wide = torch.randn(5, 8, generator=g)
    b = torch.randn(5, generator=g)
    results = []
    for fn in (onednn.linear_layer, F.linear):
        xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, wide, b))
        y = fn(xs, ws[:, 1:7], bs)  # a column slice, as the decoder's input weight is cut
        (y * torch.arange(y.numel()).view_as(y)).sum().backward()
        results.append([y.detach(), xs.grad, ws.grad, bs.grad])
    for ours, theirs in zip(*results, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_applies_to_float32_cpu_products_outside_autocast_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = torch.randn(2, 3)
    assert onednn.applies(x, x)
    assert not onednn.applies(x.bfloat16(), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn.applies(x, x)
    monkeypatch.setattr(onednn, "enabled", False)  # the switch scripts use to compare
    assert not onednn.applies(x, x)


@pytest.mark.parametrize(
    ("vendor", "mkl", "fast"),
    [
        ("GenuineIntel", True, True),
        ("AuthenticAMD", True, False),
        ("", True, False),
        ("GenuineIntel", False, False),
    ],
)
def test_mkl_fast_path_only_on_intel_cpus_with_mkl(
    monkeypatch: pytest.MonkeyPatch, vendor: str, mkl: bool, fast: bool
) -> None:
    """oneDNN is the default where MKL would run its generic code (AMD, unknown CPUs) or is
    not torch's BLAS; on Intel's CPUs MKL is."""
    monkeypatch.setattr(onednn, "cpuinfo", lambda field: vendor if field == "vendor_id" else "")
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    assert onednn.mkl_on_its_fast_path() is fast


def test_product_in_autocast_dtype_rounds_its_operands() -> None:
    """The loops' `product` in bf16 rounds x and w to bf16 and returns float32."""
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    got = onednn.product(torch.bfloat16, x, w)
    assert got.dtype == torch.float32
    want = (x.bfloat16().float() @ w.bfloat16().float().t()).bfloat16().float()
    torch.testing.assert_close(got, want)


def test_linear_layer_without_gradients_equals_torch() -> None:
    """Decoding calls the layer under no_grad: the same numbers, no autograd node."""
    x, w, b = torch.randn(2, 3, 6), torch.randn(5, 8)[:, 1:7], torch.randn(5)
    with torch.no_grad():
        y = onednn.linear_layer(x, w, b)
    assert y.grad_fn is None
    torch.testing.assert_close(y, F.linear(x, w, b))


@pytest.mark.parametrize(("out", "inp"), [(40, 3), (3, 40), (6, 6)])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_weight_grad_equals_g_transposed_times_x_in_the_weights_layout(out, inp, dtype) -> None:
    """gᵀ x whichever way round it is taken (out ≫ in: as (xᵀ g)ᵀ), contiguous (out, in)."""
    gen = torch.Generator().manual_seed(2)
    g, x = torch.randn(9, out, generator=gen), torch.randn(9, inp, generator=gen)
    got = onednn.weight_grad(dtype, g, x)
    assert got.shape == (out, inp) and got.is_contiguous() and got.dtype == torch.float32
    if dtype is None:
        torch.testing.assert_close(got, g.t() @ x)
    else:  # each operand rounded to bf16 first, float32 sums
        want = g.to(dtype).float().t() @ x.to(dtype).float()
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


LAYER_CASES = [
    pytest.param({"attention": a, **STYLES[s]}, id=f"{a}-{s}")
    for a, s in itertools.product(SCORERS, STYLES)
] + [
    pytest.param({"attention": "concat", "copy": True}, id="copy"),
    pytest.param({"attention": "concat", "attention_heads": 2}, id="two-heads"),
    pytest.param({"attention": "bilinear", "attention_scope": "local_p"}, id="local_p"),
    pytest.param({"tie_embeddings": True, "bridge": "linear"}, id="tied-bridge"),
]


@pytest.mark.parametrize("keys", LAYER_CASES)
def test_every_linear_layer_runs_through_onednn_in_training_and_decoding(
    keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 `nn.Linear` called as `module(x)` runs torch's product (MKL, 2.2× slower on
    AMD CPUs); the model calls `onednn.layer` instead. Layers with one output (vᵀ, the copy
    gate) are matrix-vector products, left to torch."""
    called: list[nn.Linear] = []
    plain = nn.Linear.forward

    def recorded(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        called.append(self)
        return plain(self, x)

    monkeypatch.setattr(nn.Linear, "forward", recorded)
    model = make_model(**keys).train()
    src, lens, tgt = batch([(5, 6), (3, 4)])
    token_loss(model(src, lens, tgt), torch.roll(tgt, -1, 1), 0.1).backward()
    greedy(model.eval(), src, lens, max_len_ratio=2.0, max_len_const=2, min_len=0)
    names = {name for name, m in model.named_modules() if m in called and m.out_features > 1}
    assert not names, names


@pytest.mark.skipif(not cpu_has_bf16_matmul(), reason="no bf16 matrix units on this CPU")
def test_bf16_laid_out_benchmarks_compute_the_float_layers() -> None:
    """scripts/bench_gru_step.py and bench_output_layer.py time bf16 products through weights
    laid out once: they must compute the GRU step and the output layer they stand for."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_gru_step
    import bench_output_layer

    torch.manual_seed(0)
    gru = nn.GRU(12, 8, batch_first=True).eval()
    x, h = torch.randn(5, 1, 12), torch.randn(1, 5, 8)
    with torch.inference_mode():
        want = gru(x, h)[1][0]  # (5, 8)
        got = bench_gru_step.bf16_laid_out(gru)(x[:, 0], h[0])
        torch.testing.assert_close(got, want, atol=0.03, rtol=0.03)
        w, b, xo = torch.randn(16, 12), torch.randn(16), torch.randn(5, 12)
        got = bench_output_layer.bf16_laid_out(w, b)(xo)
        torch.testing.assert_close(got, F.linear(xo, w, b), atol=0.1, rtol=0.03)
