"""int8 weights for CPU decoding (`nmt translate --int8`, `nmt eval --int8`).

PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic`) stores the weights
of the RNNs (encoder and decoder) and of every Linear layer in int8, one scale per tensor,
and quantizes each layer's input on the fly, batch by batch; products run in int8 with int32
accumulation (fbgemm on x86: AVX2 or AVX512 VNNI). Nothing is calibrated or retrained: it
applies to any checkpoint at load time. Where it helps: with AVX512-VNNI, decoding the
reference model ran 1.6-1.8× faster (2.1-2.3× with `--precision bf16` on a CPU with bf16
units), validation BLEU within 0.12; on AVX2 alone, no faster than float32 (sessions 16-17,
docs/benchmarks.md; the output layer was float then).

A decoder's GRU is quantized as an nn.GRUCell of the same weights (`CellGRU`): a search
runs it one step at a time, and the quantized cell is the quantized GRU's arithmetic, bit for
bit, without its sequence handling (beam 5 2-4 % faster, greedy unchanged, session 28).

Where `packs()` (oneDNN in this torch, a CPU with AVX512-VNNI: AMX's come with it), the
decoder's GRU and the Linear layers run oneDNN's int8 product on weights packed once at load
(`Packed`, `packed_linear`: the input quantized per call to u8, the weight's int8 rows with a
scale each, int32 sums, float32 out with the bias) from `PACKED_ROWS` rows on, and fbgemm's
below (`PackedGRU`, `PackedLinear`; their `small`): fbgemm starts faster, oneDNN scales
better. One thread of a Xeon with AMX, µs, fbgemm against oneDNN: a GRU step 768 -> 512 at
4 rows 140 against 273, 16: 236/271, 50: ~530/~520, 64: 616-681/471-510, 128: 1,147/773,
320: 2,867/1,603; a Linear 1,024 -> 512 at 64 rows 126-145/102-112, at 320 645/385
(session 31). A batch of 64 is 320 rows at beam 5; greedy starts at 64 and falls as its
sentences end.

The output layer (`generator.out`) is quantized here, not by PyTorch: tied to the target
embedding in most configs, and cut per batch to its shortlist (`nmt.shortlist`) by indexing
its rows (2,000 to 4,600 columns for a Multi30k batch of 64), which a packed int8 weight
does not allow, and packing every batch's cut again cost more than it saved. So `Int8Rows`
keeps it as plain int8 rows, one scale per row (cut like the float weight), and `linear`
quantizes its input per row on the fly and multiplies with `torch._int_mm` (int32 sums):
the reference model's shortlisted output layer ran 2.6-3.0x faster than float32 through
oneDNN (`scripts/bench_output_layer.py`), its greedy and beam-5 decoding 1.1-1.3x (session
19, docs/benchmarks.md). Where `packs()` and a step has `PACKED_OUTPUT_ROWS` rows or more
(a beam), the batch's rows are packed for oneDNN at that first step and its products run
there (`Int8Rows.packed`): packing 3,264 × 512 rows costs about 8 ms, and a product of 320
rows took 0.92 ms against `linear`'s 2.77 (64 rows: 0.42 against 0.78, which a greedy batch's
20-odd steps do not repay). Its input is then quantized with one scale, not one a row:
validation BLEU at beam 5 moved by 0.06 (session 31).

Left in float32, and why:
- the embeddings: a lookup, not a product;
- attention's scores, softmax and weighted sums, and multi-head attention's per-head
  parameters: activations times activations, which dynamic quantization does not cover;
- Linear layers with fewer than `MIN_OUTPUTS` outputs (the additive scorer's v, local-p's
  v_p, the copy gate): a few dot products a row, bound by reading the input, which dynamic
  quantization reads twice more (its range, then its int8 copy). The reference model's v over
  a greedy step's (64, 1, 26, 512) hidden layer: 129 µs quantized against 50 in float32
  (582 against 287 at beam 5), session 20.

The training fast path (`nmt.recurrence`) needs float GRU weights: a quantized model runs its
teacher-forced passes (copy shares, heads) step by step. CPU only: the quantized kernels
have no CUDA implementation. PyTorch marks this API for removal in favour of torchao (not
one of nmt's dependencies); its warnings are silenced here, once, where it is called.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypeGuard

import torch
from torch import Tensor, nn

from nmt import onednn
from nmt.errors import NmtError
from nmt.gru_cell import StepGRU

# What is quantized: these module types, anywhere in the model but the names below.
QUANTIZED = (nn.Linear, nn.GRU, nn.LSTM)
KEPT = ("generator.out",)  # quantized by `Int8Rows` instead (see above)
MIN_OUTPUTS = 8  # narrower Linear layers stay float (see above)

# `torch._int_mm` gives wrong sums for an inner size of 1 (a transposed (N, 1) weight's layout
# is ambiguous; torch 2.13, CPU); layers this narrow gain nothing from int8 anyway.
MIN_INNER = 8


@dataclass(frozen=True)
class Int8Rows:
    """A weight (N, K) as int8 rows with one float32 scale each: row n is about
    `weight[n] * scale[n]` (symmetric, the row's largest magnitude maps to 127)."""

    weight: Tensor  # (N, K) int8
    scale: Tensor  # (N,) float32

    @classmethod
    def of(cls, weight: Tensor) -> Int8Rows:
        w = weight.detach().float()  # (N, K)
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127  # (N,)
        q = torch.round(w / scale.unsqueeze(1)).to(torch.int8)  # (N, K), |q| <= 127
        return cls(q, scale)

    def rows(self, index: Tensor) -> Int8Rows:
        """The rows `index` (L,) int64: (L, K)."""
        return Int8Rows(self.weight.index_select(0, index), self.scale.index_select(0, index))

    @functools.cached_property
    def packed(self) -> Packed:
        """These rows packed for oneDNN's product (`Packed`), once, when first asked for."""
        return Packed.of(self)


def linear(x: Tensor, w: Int8Rows, bias: Tensor | None) -> Tensor:
    """x (..., K) float -> x·wᵀ + bias (..., N) float32, in int8: each row of x quantized
    on the fly like the weight's rows (its own scale, symmetric), int32 sums; from
    `PACKED_OUTPUT_ROWS` rows on, where `packs()`, oneDNN's product on the rows packed
    (`packed_linear`: x quantized with one scale)."""
    bias = _float(bias)
    if x.numel() >= PACKED_OUTPUT_ROWS * x.size(-1) and packs():
        return packed_linear(x, w.packed, bias)
    xq = Int8Rows.of(x.reshape(-1, x.size(-1)))  # (M, K) the input's rows, quantized alike
    acc = torch._int_mm(xq.weight, w.weight.t())  # (M, N) int32
    out = acc.to(torch.float32).mul_(xq.scale.unsqueeze(1))  # (M, N)
    out = out.mul_(w.scale) if bias is None else torch.addcmul(bias, out, w.scale)
    return out.view(*x.shape[:-1], -1)  # (..., N)


# oneDNN's int8 product on a weight packed once: u8 activations (one scale and zero point a
# call) times s8 weights (a scale a row), int32 sums, float32 out with the bias added
_QLINEAR = getattr(getattr(torch.ops, "onednn", None), "qlinear_pointwise", None)
# Rows from which oneDNN's packed int8 products run faster than fbgemm's (see above)
PACKED_ROWS = 48
# Rows from which a shortlisted output layer's products pay for packing its rows once a
# batch (8 ms for 3,264 × 512, against 0.36 ms saved a step at 64 rows, 1.9 at 320)
PACKED_OUTPUT_ROWS = 128


@functools.cache
def packs() -> bool:
    """Whether the decoder's GRU, the Linear layers and a beam's output layer take oneDNN's
    packed int8 products here (`Packed`): oneDNN present and the CPU with int8 dot-product
    units (AVX512-VNNI; AMX's come with them), where they were measured faster than fbgemm's.
    Without them oneDNN sums pairs of u8·s8 products in int16, which full-range u8 inputs
    can saturate (oneDNN's guide, "Nuances of int8 computations")."""
    try:
        vnni = bool(torch.cpu._is_vnni_supported())
    except AttributeError:  # a torch without the probe
        vnni = False
    if not (_QLINEAR is not None and onednn.available and vnni):
        return False
    with warnings.catch_warnings():  # PyTorch's deprecation notice of quantized tensors,
        warnings.simplefilter("ignore")  # once a process: given here, quietly
        torch.quantize_per_tensor_dynamic(torch.zeros(1), torch.quint8, False)
    return True


@dataclass(frozen=True)
class Packed:
    """A weight (N, K) for oneDNN's int8 product: `Int8Rows`' int8 rows packed into oneDNN's
    layout (AMX's tiles where the CPU has them), and their scales."""

    packed: Tensor  # oneDNN's layout of the (N, K) int8 rows
    scale: Tensor  # (N,) float32
    zero: Tensor  # (N,) int32 zeros: symmetric rows

    @classmethod
    def of(cls, rows: Int8Rows) -> Packed:
        zero = torch.zeros(rows.scale.numel(), dtype=torch.int32)
        return cls(torch.ops.onednn.qlinear_prepack(rows.weight, None), rows.scale, zero)


def _float(bias: Tensor | None) -> Tensor | None:
    return None if bias is None else bias.detach().float()


def packed_linear(x: Tensor, w: Packed, bias: Tensor | None) -> Tensor:
    """x (..., K) float -> x·wᵀ + bias (..., N) float32 (bias float32 or None), in int8: x
    quantized on the fly
    (`quantize_per_tensor_dynamic`: its range, then its u8 copy), its rows in float32 and
    padded to their `onednn.bucket` (zeros: inside any range; their outputs dropped)."""
    assert _QLINEAR is not None
    flat = x.reshape(-1, x.size(-1))  # (M, K)
    m = flat.size(0)
    cast = onednn.bucket(m) != m or flat.dtype != torch.float32  # autocast gives bf16 rows
    rows = onednn.padded_rows(flat, torch.float32) if cast else flat  # (M', K) float32
    qx = torch.quantize_per_tensor_dynamic(rows, torch.quint8, False)  # (M', K)
    # u8 values (a view of its storage: `int_repr` would copy them), their scale and zero point
    activations = (qx.view(torch.uint8), qx.q_scale(), qx.q_zero_point())
    # float32 out as it is (scale 1, zero point 0), no post-op
    y = _QLINEAR(
        *activations, w.packed, w.scale, w.zero, bias, 1.0, 0, torch.float32, "none", [], ""
    )  # (M', N)
    return y[:m].view(*x.shape[:-1], -1)  # (..., N)


class PackedLinear(nn.Module):
    """An `nn.Linear` for int8 decoding: oneDNN's product on a `Packed` weight at
    `PACKED_ROWS` rows and more, PyTorch's quantized Linear (fbgemm) below. (..., in) ->
    (..., out) float32."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight_packed = Int8Rows.of(layer.weight).packed
        self.bias = _float(layer.bias)  # (out,)
        small = nn.Sequential(layer)  # quantized in its place here; `layer` stays as it is
        _fbgemm(small, {nn.Linear})
        self.small = small[0]

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() < PACKED_ROWS * x.size(-1):
            return self.small(x)
        return packed_linear(x, self.weight_packed, self.bias)


class PackedGRU(StepGRU):
    """A decoder's `nn.GRU` (`step_gru`) for int8 decoding: at `PACKED_ROWS` rows and more its
    two products on oneDNN (`Packed`), the gates and the state in float32
    (`nmt.gru_cell.StepGRU`); below, PyTorch's quantized cell (`CellGRU`, fbgemm)."""

    def __init__(self, gru: nn.GRU) -> None:
        super().__init__(gru)
        self.small = _fbgemm(CellGRU(gru), {nn.GRUCell})  # its own cell, quantized

    def weight(self, w: Tensor) -> Packed:
        return Int8Rows.of(w).packed

    def bias(self, b: Tensor) -> Tensor:
        return b.detach().float()

    def product(self, x: Tensor, w: Packed, b: Tensor) -> Tensor:
        return packed_linear(x, w, b)

    def forward(self, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.size(0) < PACKED_ROWS:
            return self.small(x, h0)
        return super().forward(x, h0)


def _fbgemm(model: nn.Module, spec: Collection[str | type[nn.Module]]) -> nn.Module:
    """`model`, in place, with its submodules named or typed in `spec` (never the model
    itself: a lone layer goes in an nn.Sequential) in PyTorch's dynamic int8 quantization
    (fbgemm on x86), its deprecation notices silenced."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices, once per layer
        return quantize_dynamic(model, set(spec), inplace=True)


def step_gru(module: nn.Module) -> TypeGuard[nn.GRU]:
    """Whether decoding runs this RNN a step at a time in a form of its own (`CellGRU` here,
    `nmt.laid_out.LaidOutGRU` in bf16): a one-layer, one-direction, batch-first nn.GRU with
    biases, as the decoders' are."""
    return (
        type(module) is nn.GRU
        and module.num_layers == 1
        and not module.bidirectional
        and module.batch_first
        and module.bias
    )


class CellGRU(nn.Module):
    """A `step_gru` nn.GRU as an nn.GRUCell of the same weights, run a step at a time: what
    int8 decoding quantizes for the decoders. Takes and gives what the nn.GRU did: x (B, T,
    In), h0 (1, B, H) or None -> outputs (B, T, H), h_T (1, B, H).

    Why: quantized, the cell is the quantized GRU's arithmetic (the same numbers, bit for
    bit) without its sequence handling, and a search step is one time step: the reference
    decoder's GRU at a greedy step's 64 rows 629-632 → 573-582 µs at one thread, 541-660 →
    402-428 at two; at beam 5's 320 rows 2,801-2,843 → 2,765-2,788 and 1,837-1,888 → 1,698-
    1,754 (2 cores of a Xeon with AMX, session 28). Over several steps (the teacher-forced
    re-read of a copy model's hypotheses) each step's input is quantized on its own, as the
    search quantized it, where the quantized GRU takes one scale for all steps: `make train`'s
    copy model's copy shares over 500 validation sentences summed 703.68 before and 703.37
    after, its translations the same."""

    def __init__(self, gru: nn.GRU) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = gru.input_size, gru.hidden_size, 1
        self.cell = nn.GRUCell(gru.input_size, gru.hidden_size)
        w_ih, w_hh, b_ih, b_hh = gru.all_weights[0]
        with torch.no_grad():
            for mine, theirs in zip(self.cell.parameters(), (w_ih, w_hh, b_ih, b_hh), strict=True):
                mine.copy_(theirs)

    def forward(self, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        h = x.new_zeros(x.size(0), self.hidden_size) if h0 is None else h0[0]  # (B, H)
        outs = []
        for t in range(x.size(1)):
            h = self.cell(x[:, t], h)  # (B, H)
            outs.append(h)
        out = outs[0].unsqueeze(1) if len(outs) == 1 else torch.stack(outs, dim=1)  # (B, T, H)
        return out, h.unsqueeze(0)


def quantize(model: nn.Module, device_type: str) -> nn.Module:
    """`model` (eval mode) with int8 weights in its RNNs and Linear layers, in place (the
    decoders' GRUs as `PackedGRU`s where `packs()`, else `CellGRU`s; the Linear layers as
    `PackedLinear`s where `packs()`), and an int8 copy of its output layer
    (`Generator.out_packed`)."""
    if device_type != "cpu":
        raise NmtError(f"--int8: CPU decoding only (the model is on {device_type})")
    names = decoding_layers(model)
    packed = packs()
    for name in sorted(names):
        module = model.get_submodule(name)
        mine: nn.Module | None = None  # a form of nmt's own, else PyTorch's quantized layer
        if packed and step_gru(module):
            mine = PackedGRU(module)
        elif packed and isinstance(module, nn.Linear):
            mine = PackedLinear(module)
        elif step_gru(module):  # its quantized cell, quantized below by name
            mine, names = CellGRU(module), names | {f"{name}.cell"}
        if mine is not None:
            replace_module(model, name, mine)
            names = names - {name}
    generator = getattr(model, "generator", None)  # nmt.model.Generator, of a Seq2Seq
    if generator is not None and generator.out.in_features >= MIN_INNER:
        generator.out_packed = Int8Rows.of(generator.out.weight)
    return _fbgemm(model.eval(), names)


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` where `model`'s submodule `name` was."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def decoding_layers(model: nn.Module) -> set[str]:
    """The names of the layers decoding gives a faster weight form (int8 here, bf16 laid out
    in `nmt.laid_out`): RNNs and Linear layers, but the output layer and the narrow ones."""
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, QUANTIZED)
        and name not in KEPT
        and not (isinstance(module, nn.Linear) and module.out_features < MIN_OUTPUTS)
    }
