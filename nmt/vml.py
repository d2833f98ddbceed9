"""Float32 tanh on the CPU, around MKL's vector math library where MKL runs its slow path.

Why: ATen's float32 tanh on the CPU is MKL's (its vector math library, VML), which runs
AMD's CPUs on a generic code path. There it is several times slower than ATen's own
sigmoid, and tanh(x) = 2σ(2x) − 1 exactly. 2 cores of an AMD EPYC Zen 4, one thread, µs:

| values | tanh | 2σ(2x) − 1 (four operators) |
|---|---|---|
| 4,096 | 13.2 | 13.3 |
| 32,768 (64 × 512: a decoder step's gates) | 91.0 | 27.4 |
| 163,840 (320 × 512: a beam of 5) | 432 | 115 |

Below about 8,192 values the four operators' own costs outweigh the arithmetic. On Intel's
CPUs MKL runs its own fast path and its tanh outruns the sigmoid (`TANH_FAST`).

`tanh` is for the code that runs without autograd recording (the hand-written training
loops, decoding); under autograd it is torch's tanh, whose backward reads tanh's output.
`nmt.attention.additive_hidden` keeps its own sigmoid form, as its scores read σ itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt import onednn

# Whether float32 tanh outruns the sigmoid form: where MKL's VML, which ATen's tanh calls, runs
# its own fast path (Intel's CPUs; `onednn.mkl_on_its_fast_path`). On 2 cores of a Xeon with
# AMX, one thread: tanh 12.0 µs for 32,768 values against the sigmoid's 16.3 (98.7 for tanh
# with MKL held to its generic path, `MKL_ENABLE_INSTRUCTIONS=SSE4_2`, as AMD's CPUs are).
TANH_FAST = onednn.mkl_on_its_fast_path()

# The fewest values for which the sigmoid form is taken (the table above)
SIGMOID_FORM_FROM = 8192


def tanh(x: Tensor, out: Tensor | None = None) -> Tensor:
    """torch.tanh(x, out=out), as 2σ(2x) − 1 where that is faster (see above): float32 on
    the CPU, `SIGMOID_FORM_FROM` values or more, MKL off its fast path, and x not recording
    a gradient. `out` may be x itself (in place). Within 2e-7 of tanh (|tanh| ≤ 1)."""
    if (
        TANH_FAST
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or x.numel() < SIGMOID_FORM_FROM
        or (x.requires_grad and torch.is_grad_enabled())
    ):
        return x.tanh_() if out is x else torch.tanh(x, out=out)
    return torch.mul(x, 2, out=out).sigmoid_().mul_(2).sub_(1)
