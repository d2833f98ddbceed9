"""PyTorch's GRU cell after its two products, forward and backward by hand, in float32: the
gate arithmetic shared by the hand-written loops (`nmt.recurrence`'s decoder and
`nmt.encoder_loop`'s encoder). Same equations as nn.GRU:

    r, z = σ(gi_r + gh_r), σ(gi_z + gh_z);  n = tanh(gi_n + r ⊙ gh_n);  h' = (1 − z) n + z h

with gi = x W_iᵀ + b_i and gh = h W_hᵀ + b_h. Shape legend: N rows, H hidden size; any
leading dimensions before N ride along (the encoder's two directions).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nmt import vml

# g · (1 - y²) and g · y (1 - y) from the output y, each one pass (autograd's own kernels);
# their out= forms write into a given tensor (a slice of the gates' gradient).
tanh_backward = torch.ops.aten.tanh_backward
sigmoid_backward = torch.ops.aten.sigmoid_backward
tanh_backward_into = torch.ops.aten.tanh_backward.grad_input
_sigmoid_backward_into = torch.ops.aten.sigmoid_backward.grad_input


def gru_gates(
    gi: Tensor, gh: Tensor, h: Tensor, s: dict[str, Tensor], out: Tensor | None = None
) -> Tensor:
    """PyTorch's GRU cell after its two products, in float32: gi (N, 3H) = x W_iᵀ + b_i and
    gh (N, 3H) = h W_hᵀ + b_h (gates r, z, n in that order), h (N, H) -> the new h (N, H),
    written into `out` where given (a slot of the caller's buffer of all steps' states).
    Saves in `s` what `gru_gates_back` reads.

    Five operators on (N, H)-sized tensors where the plain equations take eight (addcmul
    and lerp fuse a product with its sum): each runs in microseconds at a decoder step's
    64 rows, so their count, not their arithmetic, is the cost. Except tanh's where ATen
    calls MKL off its fast path (AMD's CPUs): `nmt.vml.tanh` takes three more operators
    there, 3× faster at 64 × 512."""
    size = h.size(-1)
    rz = torch.add(gi[..., : 2 * size], gh[..., : 2 * size]).sigmoid_()  # (N, 2H)
    r, z = rz[..., :size], rz[..., size:]
    gh_n = gh[..., 2 * size :]
    n = torch.addcmul(gi[..., 2 * size :], r, gh_n)  # (N, H) gi_n + r gh_n
    n = vml.tanh(n, out=n)  # (N, H) in place
    s.update(h=h, rz=rz, n=n, gh_n=gh_n)
    return torch.lerp(n, h, z, out=out)  # (1 - z) n + z h


def gru_gates_back(
    dh: Tensor, s: dict[str, Tensor], out: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradient of the new h (N, H) -> gradients of gi (N, 3H) and gh (N, 3H), and h's own
    share (N, H) (the share through gh, d_gh W_h, is the caller's product). The gates'
    gradients are written into their slices of d_gi and d_gh, not concatenated: new tensors,
    or the caller's `out` (d_gi, d_gh), slots of its buffers of all steps' gradients."""
    rz, n, h, gh_n = s["rz"], s["n"], s["h"], s["gh_n"]
    size = h.size(-1)
    r, z = rz[..., :size], rz[..., size:]
    if out is None:
        d_gi = dh.new_empty(*dh.shape[:-1], 3 * size)  # (N, 3H)
        d_gh = torch.empty_like(d_gi)  # (N, 3H)
    else:
        d_gi, d_gh = out
    d_rz, d_n = d_gi[..., : 2 * size], d_gi[..., 2 * size :]  # views: (N, 2H), (N, H)
    dh_z = dh * z  # (N, H) h's own share
    tanh_backward_into(dh - dh_z, n, grad_input=d_n)  # d(gi_n) = dh (1 − z) (1 − n²)
    torch.mul(d_n, gh_n, out=d_rz[..., :size])  # into r, before its sigmoid
    torch.mul(dh, h - n, out=d_rz[..., size:])  # into z, before its sigmoid
    _sigmoid_backward_into(d_rz, rz, grad_input=d_rz)  # in place: σ'(·) of r and z
    d_gh[..., : 2 * size] = d_rz
    torch.mul(d_n, r, out=d_gh[..., 2 * size :])  # d(gh_n) = d(gi_n) r
    return d_gi, d_gh, dh_z


class StepGRU(nn.Module):
    """A decoder's one-layer, one-direction, batch-first `nn.GRU` for decoding, its two
    products in a form a subclass gives: bf16 on laid-out weights (`nmt.laid_out`), int8 on
    packed ones (`nmt.int8`). The subclass makes each weight's and bias's form once (`weight`,
    `bias`) and multiplies in it (`product`); the gates and the state are float32
    (`gru_gates`). Takes and gives what the nn.GRU did: x (B, T, In), h0 (1, B, H) or None ->
    outputs (B, T, H), h_T (1, B, H), both float32. With T > 1 (a teacher-forced re-read) the
    input half of every step's gates is one product."""

    def __init__(self, gru: nn.GRU) -> None:
        super().__init__()
        assert gru.num_layers == 1 and not gru.bidirectional and gru.batch_first and gru.bias
        self.input_size, self.hidden_size, self.num_layers = gru.input_size, gru.hidden_size, 1
        w_ih, w_hh, b_ih, b_hh = gru.all_weights[0]
        self.w_ih, self.w_hh = self.weight(w_ih), self.weight(w_hh)  # (3H, In), (3H, H)
        self.b_ih, self.b_hh = self.bias(b_ih), self.bias(b_hh)  # (3H,)

    def weight(self, w: Tensor) -> Any:
        """A weight (out, in) in the form `product` multiplies."""
        raise NotImplementedError

    def bias(self, b: Tensor) -> Tensor:
        """A bias (out,) in the form `product` adds."""
        raise NotImplementedError

    def product(self, x: Tensor, w: Any, b: Tensor) -> Tensor:
        """x (..., in) -> x wᵀ + b (..., out) float32."""
        raise NotImplementedError

    def forward(self, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        B, T = x.size(0), x.size(1)
        f32 = torch.float32
        h = x.new_zeros(B, self.hidden_size, dtype=f32) if h0 is None else h0[0].float()  # (B, H)
        gi = self.product(x, self.w_ih, self.b_ih)  # (B, T, 3H)
        outs = []
        for t in range(T):
            gh = self.product(h, self.w_hh, self.b_hh)  # (B, 3H)
            h = gru_gates(gi[:, t], gh, h, {})  # (B, H)
            outs.append(h)
        out = outs[0].unsqueeze(1) if T == 1 else torch.stack(outs, dim=1)  # (B, T, H)
        return out, h.unsqueeze(0)
