"""bf16 weights laid out once for oneDNN, for CPU decoding on bf16 matrix units
(`nmt translate --precision bf16` on a CPU with AMX or AVX512-BF16).

Why: under bf16 autocast every product casts its float32 weight to bf16 and oneDNN then lays
it out again for its kernels (AMX tiles), at every decoding step; a decoding weight never
changes, so both can happen once, at load (`torch.ops.mkldnn._reorder_linear_weight`, the
layout Inductor's frozen CPU graphs use), and each step runs `_linear_pointwise` on it. And
autocast leaves a CPU GRU in float32 (1,180 µs a greedy step of the reference decoder on 2
cores of a Xeon with AMX, against 439 for `--int8`'s and 341 for this one's,
`scripts/bench_gru_step.py`), so the decoder's GRU step is written out here: two laid-out
products, then `nmt.gru_cell.gru_gates` in float32, its state kept in float32.

What is laid out is what `nmt.int8` quantizes, by the same rule (`int8.decoding_layers`):
every `nn.Linear` with at least `int8.MIN_OUTPUTS` outputs but the output layer, and the
GRUs this module runs (one layer, one direction: the decoders'). The output layer is cut to
each batch's shortlist (`nmt.shortlist`), so its bf16 copy is kept as rows and a batch's cut
is laid out once a batch (`LaidOut.rows`; 0.8 ms for 2,500 columns, against 88 µs saved at
each of a batch's steps). Left as they are: LSTMs, several-layer RNNs, the attention's
activation-by-activation products, and the encoder's bidirectional GRU, run once a batch by
nn.GRU's fused inference kernel in float32: by hand with laid-out products it took 16.4 ms
for a batch of 64 × 24 pieces against nn.GRU's 10 (its steps' products are small: 64 × 256
× 768).

Only the products run in bf16: each returns float32, and the model runs outside autocast
(`Translator`), so everything else is float32 decoding's own arithmetic. Under autocast the
rest ran in bf16 and took slow paths a greedy step of the reference model (2 cores of a
Xeon with AMX): the additive scorer's tanh instead of its float32 sigmoid route
(`nmt.attention.additive_hidden`), its vᵀ and the context as bf16 products of one output
column: together about 1 ms a step, more than the laid-out products save.

`applies` says where: the CPU, bf16, oneDNN present and bf16 units to run it (without them
oneDNN emulates bf16 at a few GFLOP/s). `Translator` lays a model out there unless it is
int8 (`--int8` quantizes the same layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt import int8, onednn
from nmt.gru_cell import StepGRU
from nmt.runtime import cpu_has_bf16_matmul

BF16 = torch.bfloat16


def applies(device_type: str, precision: str) -> bool:
    """Whether a decoding model on `device_type` in `precision` is laid out (see above)."""
    return (
        device_type == "cpu" and precision == "bf16" and onednn.available and cpu_has_bf16_matmul()
    )


def _lay(weight: Tensor) -> Tensor:
    """weight (out, in) -> its bf16 copy in oneDNN's layout for `_linear_pointwise`, for any
    number of rows (batch size hint None: one layout serves a greedy step's 64 rows and a
    beam's 320 alike, within 5 % of one laid out for the exact count)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(BF16).contiguous(), None)


def _product(x: Tensor, laid: Tensor, bias: Tensor | None, columns: int | None = None) -> Tensor:
    """x (..., in) any float dtype -> x Wᵀ + b (..., out) float32, in bf16, for a weight from
    `_lay` (and its bias in bf16); the first `columns` outputs only where given (a weight
    padded with zero rows). The rows are padded with zeros to their `onednn.bucket`."""
    flat = x.reshape(-1, x.size(-1))  # (N, in)
    rows = onednn.padded_rows(flat, BF16)  # (N', in)
    y = onednn.pointwise(rows, laid, bias)[: flat.size(0), :columns].float()  # (N, out)
    return y.view(*x.shape[:-1], y.size(-1))


@dataclass(frozen=True)
class LaidOut:
    """An output layer (V, E) and its bias (V,) for decoding: bf16 rows to cut a batch's
    shortlist from (`rows`), and the same rows and bias with zeros up to their `onednn.bucket`, the
    rows laid out: padded once, where they are cut, not at every step."""

    weight: Tensor  # (N, E) bf16 rows
    bias: Tensor  # (N,) bf16
    laid: Tensor  # (bucket(N), E) the rows and zero rows, laid out for oneDNN
    laid_bias: Tensor  # (bucket(N),) the bias and zeros

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor) -> LaidOut:
        rows, b = weight.detach().to(BF16).contiguous(), bias.detach().to(BF16)  # (N, E), (N,)
        padded = onednn.padded_rows(rows, BF16), onednn.padded_rows(b.unsqueeze(1), BF16)
        return cls(rows, b, _lay(padded[0]), padded[1].squeeze(1))

    def rows(self, index: Tensor) -> LaidOut:
        """The rows `index` (L,) int64 and their biases, laid out: (L, E)."""
        return LaidOut.of(self.weight.index_select(0, index), self.bias.index_select(0, index))


def linear(x: Tensor, w: LaidOut) -> Tensor:
    """x (..., E) -> x·wᵀ + its bias (..., N) float32, the product in bf16."""
    return _product(x, w.laid, w.laid_bias, columns=w.weight.size(0))


class LaidOutLinear(nn.Module):
    """An `nn.Linear` for decoding: its product in bf16 on a weight laid out once.
    (..., in) -> (..., out) float32."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.laid = _lay(layer.weight)  # (out, in) oneDNN's layout
        self.bias = None if layer.bias is None else layer.bias.detach().to(BF16)  # (out,)

    def forward(self, x: Tensor) -> Tensor:
        return _product(x, self.laid, self.bias)


class LaidOutGRU(StepGRU):
    """A decoder's `nn.GRU` (`int8.step_gru`) with its two products in bf16 on weights laid
    out once (`nmt.gru_cell.StepGRU`: the gates and the state in float32)."""

    def weight(self, w: Tensor) -> Tensor:
        return _lay(w)  # (out, in) oneDNN's layout

    def bias(self, b: Tensor) -> Tensor:
        return b.detach().to(BF16)

    def product(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return _product(x, w, b)


def lay_out(model: nn.Module) -> nn.Module:
    """`model` (eval mode) for bf16 decoding, in place: its Linear layers and decoder GRU laid
    out (`LaidOutLinear`, `LaidOutGRU`) and a bf16 copy of its output layer
    (`Generator.out_packed`). The float32 weights stay where nothing replaced them."""
    for name in int8.decoding_layers(model):
        module = model.get_submodule(name)
        if isinstance(module, nn.Linear):
            int8.replace_module(model, name, LaidOutLinear(module))
        elif int8.step_gru(module):
            int8.replace_module(model, name, LaidOutGRU(module))
    generator = getattr(model, "generator", None)  # nmt.model.Generator, of a Seq2Seq
    if generator is not None:
        generator.out_packed = LaidOut.of(generator.out.weight, generator.out.bias)
    return model.eval()
