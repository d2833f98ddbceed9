"""int8 weights for CPU decoding (`nmt translate --int8`, `nmt eval --int8`).

PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic`) stores the weights
of the RNNs (encoder and decoder) and of every Linear layer in int8, one scale per tensor,
and quantizes each layer's input on the fly, batch by batch; products run in int8 with int32
accumulation (fbgemm on x86: AVX2 or AVX512 VNNI). Nothing is calibrated or retrained: it
applies to any checkpoint at load time. Where it helps: with AVX512-VNNI, decoding the
reference model ran 1.6-1.8× faster (2.1-2.3× with `--precision bf16` on a CPU with bf16
units, which puts the output layer in bf16), validation BLEU within 0.12; on AVX2 alone,
no faster than float32 (docs/benchmarks.md).

Left in float32, and why:
- the embeddings: a lookup, not a product;
- the output layer (`generator.out`): tied to the target embedding in most configs, and
  cut per batch to its shortlist (`nmt.shortlist`) by indexing its rows, which a packed
  int8 weight does not allow (2,000 to 4,600 columns for a Multi30k batch of 64);
- attention's scores, softmax and weighted sums, and multi-head attention's per-head
  parameters: activations times activations, which dynamic quantization does not cover.

The training fast path (`nmt.recurrence`) needs float GRU weights: a quantized model runs its
teacher-forced passes (copy shares, heads) step by step. CPU only: the quantized kernels
have no CUDA implementation. PyTorch marks this API for removal in favour of torchao (not
one of nmt's dependencies); its warnings are silenced here, once, where it is called.
"""

from __future__ import annotations

import warnings

from torch import nn

from nmt.errors import NmtError

# What is quantized: these module types, anywhere in the model but the names below.
QUANTIZED = (nn.Linear, nn.GRU, nn.LSTM)
KEPT = ("generator.out",)


def quantize(model: nn.Module, device_type: str) -> nn.Module:
    """`model` (eval mode) with int8 weights in its RNNs and Linear layers, in place."""
    if device_type != "cpu":
        raise NmtError(f"--int8: CPU decoding only (the model is on {device_type})")
    from torch.ao.quantization import quantize_dynamic

    names = {
        name
        for name, module in model.named_modules()
        if isinstance(module, QUANTIZED) and name not in KEPT
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices, once per layer
        return quantize_dynamic(model.eval(), names, inplace=True)
