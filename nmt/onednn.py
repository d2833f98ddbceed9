"""Float32 matrix products through oneDNN on the CPU, where torch's own mm goes to its BLAS.

Why: torch's CPU build sends float32 `mm`/`addmm`/`linear` to MKL, and MKL runs AMD CPUs on
its generic code path. On a 2-core AMD EPYC (Zen 5, AVX-512) the model's product shapes ran
at 190-225 GFLOP/s through MKL and at 420-510 through oneDNN, the library torch already
uses for bf16 products (`scripts/peers/limit.py` times both; docs/benchmarks.md, session 18), with
float32 arithmetic and float32 rounding errors either way. oneDNN is reached through
`torch.ops.mkldnn._linear_pointwise`, the op Inductor's CPU backend emits for linear layers:
x Wᵀ + b for dense (or transposed) x and W.

`enabled` is the switch: on where MKL would take its generic path (AMD CPUs), off on Intel's
CPUs, where MKL is the faster of the two in a training step (scripts turn it on or off to
compare); `applies` says whether a product on these tensors goes through oneDNN: float32 on
the CPU with autocast off (bf16 products already go through oneDNN, and a GPU has its own
libraries).

`linear` is for code that writes its own backward (`nmt.recurrence`, `nmt.encoder_loop`),
`weight_grad` for its weight gradients; `linear_layer` is an `nn.Linear`'s forward with its
two backward products through oneDNN too, and `layer(module, x)` is what a model calls in
place of `module(x)` for its `nn.Linear` layers (int8's quantized ones run themselves).
`bucket` and `padded_rows` pad decoding's products' rows (`nmt.laid_out`'s bf16 ones,
`nmt.int8`'s packed int8 ones) to a few sizes, so that oneDNN builds few kernels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from nmt.runtime import cpuinfo

_POINTWISE = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
available = _POINTWISE is not None and torch.backends.mkldnn.is_available()


def mkl_on_its_fast_path() -> bool:
    """Whether torch's float32 products run on MKL's own code for this CPU: MKL is torch's
    BLAS and the CPU is Intel's. There MKL is as fast as oneDNN alone (the reference model's
    shapes within 5 % either way on a 2-core Xeon with AMX) and faster in the step: oneDNN
    ran it at 0.84-0.88× per batch (`scripts/profile_step.py --paired onednn`, fp32, three
    models; docs/benchmarks.md, session 24)."""
    return torch.backends.mkl.is_available() and cpuinfo("vendor_id") == "GenuineIntel"


# Whether float32 products go through oneDNN: where it exists and MKL would not run this
# CPU on its fast path (AMD's). Tests and scripts set it to compare or to test the path.
enabled = available and not mkl_on_its_fast_path()


def applies(*tensors: Tensor) -> bool:
    """Whether products of these tensors go through oneDNN here."""
    return (
        enabled
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not torch.is_autocast_enabled("cpu")
    )


def dense(t: Tensor) -> bool:
    """Whether a 2-D operand is laid out as oneDNN's fast kernels read it: contiguous, or a
    transposed contiguous tensor. A column slice (a weight's first columns) is neither, and
    oneDNN takes such an operand at a reference kernel's speed (a training step 60× slower):
    those go to torch's own product."""
    return t.dim() == 2 and (t.is_contiguous() or t.t().is_contiguous())


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (N, in) @ weight (out, in)ᵀ + bias (out,) -> (N, out), no autograd: through oneDNN
    where it `applies` and both operands are `dense` (transposed views are), else torch's own."""
    if not (applies(x, weight) and dense(x) and dense(weight)):
        return F.linear(x, weight, bias)
    return pointwise(x, weight, bias)


def pointwise(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """oneDNN's x @ weightᵀ + bias itself, any dtype it takes, no checks (`linear` checks)."""
    assert _POINTWISE is not None, "this torch has no oneDNN"
    return _POINTWISE(x, weight, bias, "none", [], "")


ROWS = 16  # products' rows padded to a multiple of this at least (`bucket`)


def bucket(n: int) -> int:
    """n rounded up to a multiple of ROWS, or of an eighth of the power of two above it where
    that is more (at most 1/4 more: 64 stays, 65 -> 80, 1,216 -> 1,280, 3,300 -> 3,584).

    Why: oneDNN builds a kernel for each new product shape (about 1 ms each, AMX's just-in-
    time code), and a search meets many: its row count falls at every finished sentence, a
    batch's shortlist has its own column count, its keys their own row count. Unbucketed, a
    first pass over test_2016_flickr spent 0.4 s greedy and 0.95 s beam 5 of 1.0 and 3.2 on
    building them in bf16 (2 cores of a Xeon with AMX). An AMX tile holds 16 rows: padding to
    ROWS costs almost no arithmetic. Decoding's bf16 (`nmt.laid_out`) and int8 (`nmt.int8`)
    products pad their rows to it."""
    step = max(ROWS, 1 << max(n.bit_length() - 3, 0))
    return -(-n // step) * step


def padded_rows(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x (N, K) -> (bucket(N), K) in `dtype`, contiguous: x (cast), then zero rows."""
    n = x.size(0)
    out = x.new_empty(bucket(n), x.size(1), dtype=dtype)  # (N', K)
    out[:n] = x  # the cast and the copy in one pass
    if out.size(0) > n:
        out[n:] = 0
    return out


def product(dtype: torch.dtype | None, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x (N, in) @ w (out, in)ᵀ + b (out,) -> (N, out) float32, no autograd, for the
    hand-written loops: in `dtype` (autocast's; each operand cast unless it already is), or
    with dtype None in float32, through oneDNN where it `applies`."""
    if dtype is None:
        return linear(x, w, b)
    x, w = x.to(dtype), w.to(dtype)
    y = x @ w.t() if b is None else torch.addmm(b.to(dtype), x, w.t())
    return y.float()


def weight_grad(dtype: torch.dtype | None, g: Tensor, x: Tensor) -> Tensor:
    """gᵀ x for g (N, out), x (N, in) -> (out, in) float32, no autograd: a weight's gradient
    from its output's gradient and its input, in `dtype` as `product` takes it.

    Why not `linear(g.t(), x.t())`: oneDNN reads its input row-major and first copies a
    transposed one, and gᵀ is the large operand for an output layer (N × 8,000: 29 ms for
    the reference model's weight gradient, 8 of them the copy, against 21 for the product
    alone). So in float32 it is taken as (xᵀ g)ᵀ wherever that copies fewer values: xᵀ (N ×
    in) before, and the result (out × in) after, into the weight's own layout."""
    n, out, inp = g.size(0), g.size(1), x.size(1)
    if dtype is None and applies(g, x) and n * inp + out * inp < n * out:
        return linear(x.t().contiguous(), g.t()).t().contiguous()  # (xᵀ g)ᵀ
    return product(dtype, g.t(), x.t())


def mm(a: Tensor, b: Tensor) -> Tensor:
    """a (N, K) @ b (K, M) -> (N, M), no autograd (`linear` with b as a transposed weight)."""
    return linear(a, b.t())


def linear_layer(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear(x, weight, bias) for x (..., in), with gradients; forward and backward
    products through oneDNN where it `applies`."""
    if not applies(x, weight):
        return F.linear(x, weight, bias)
    if not torch.is_grad_enabled():  # decoding: no autograd node a step
        return _leading(x, linear(x.reshape(-1, x.size(-1)), weight.contiguous(), bias))
    return _Linear.apply(x, weight, bias)


def layer(module: nn.Module, x: Tensor) -> Tensor:
    """`module(x)` for a model's Linear layer: a plain `nn.Linear` through `linear_layer`
    (oneDNN in float32 on the CPU, forward and backward), any other module (int8's quantized
    Linear, `nmt.int8`) as it runs itself.

    Why not an `nn.Linear` subclass: int8's `quantize_dynamic` converts modules of exactly
    the type `nn.Linear` and would leave a subclass in float32."""
    if type(module) is nn.Linear:
        return linear_layer(x, module.weight, module.bias)
    return module(x)


def _leading(x: Tensor, y: Tensor) -> Tensor:
    """y (N, out), computed from x (..., in) flattened, as (..., out)."""
    return y.view(*x.shape[:-1], y.size(-1))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        flat = x.reshape(-1, x.size(-1))  # (N, in)
        weight = weight.contiguous()  # a column slice, copied once for both products
        ctx.save_for_backward(flat, weight)
        ctx.has_bias = bias is not None
        return _leading(x, linear(flat, weight, bias))  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        flat, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))  # (N, out)
        g_x = g_w = g_b = None
        if ctx.needs_input_grad[0]:
            g_x = _leading(grad, mm(g, weight))  # (..., in)
        if ctx.needs_input_grad[1]:
            g_w = weight_grad(None, g, flat)  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            g_b = g.sum(0)  # (out,)
        return g_x, g_w, g_b
