"""PyTorch's GRU cell after its two products, forward and backward by hand, in float32: the
gate arithmetic shared by the hand-written loops (`nmt.recurrence`'s decoder and
`nmt.encoder_loop`'s encoder). Same equations as nn.GRU:

    r, z = σ(gi_r + gh_r), σ(gi_z + gh_z);  n = tanh(gi_n + r ⊙ gh_n);  h' = (1 − z) n + z h

with gi = x W_iᵀ + b_i and gh = h W_hᵀ + b_h. Shape legend: N rows, H hidden size; any
leading dimensions before N ride along (the encoder's two directions).
"""

from __future__ import annotations

import torch
from torch import Tensor

# g · (1 - y²) and g · y (1 - y) from the output y, each one pass (autograd's own kernels).
tanh_backward = torch.ops.aten.tanh_backward
sigmoid_backward = torch.ops.aten.sigmoid_backward


def gru_gates(gi: Tensor, gh: Tensor, h: Tensor, s: dict[str, Tensor]) -> Tensor:
    """PyTorch's GRU cell after its two products, in float32: gi (N, 3H) = x W_iᵀ + b_i and
    gh (N, 3H) = h W_hᵀ + b_h (gates r, z, n in that order), h (N, H) -> the new h (N, H).
    Saves in `s` what `gru_gates_back` reads."""
    size = h.size(-1)
    rz = torch.sigmoid(gi[..., : 2 * size] + gh[..., : 2 * size])  # (N, 2H)
    r, z = rz[..., :size], rz[..., size:]
    gh_n = gh[..., 2 * size :]
    n = torch.tanh(gi[..., 2 * size :] + r * gh_n)  # (N, H)
    s.update(h=h, rz=rz, n=n, gh_n=gh_n)
    return n + z * (h - n)  # (1 - z) n + z h


def gru_gates_back(dh: Tensor, s: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Gradient of the new h (N, H) -> gradients of gi (N, 3H) and gh (N, 3H), and h's own
    share (N, H) (the share through gh, d_gh W_h, is the caller's product)."""
    rz, n, h, gh_n = s["rz"], s["n"], s["h"], s["gh_n"]
    size = h.size(-1)
    r, z = rz[..., :size], rz[..., size:]
    d_n = tanh_backward(dh * (1 - z), n)  # (N, H)
    d_rz = sigmoid_backward(torch.cat([d_n * gh_n, dh * (h - n)], dim=-1), rz)  # (N, 2H)
    d_gi = torch.cat([d_rz, d_n], dim=-1)  # (N, 3H)
    d_gh = torch.cat([d_rz, d_n * r], dim=-1)  # (N, 3H)
    return d_gi, d_gh, dh * z
