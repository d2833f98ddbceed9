"""The bidirectional GRU encoder with a hand-written backward: the training fast path on CPUs.

Why: on a CPU, nn.GRU runs a packed sequence one step at a time through autograd, which
records some twenty operators per step and direction, sums each weight's gradient one step
at a time (two products of a step's rows, per step and direction), and under bf16 autocast
casts the weights again at every step. `encoder_loop` runs the same equations
(`nmt.gru_cell`) without recording: the weights are cast once a batch, the input half of
both directions' gates is one product over all tokens, each step is one batched product for
both directions, and the backward gives every weight gradient as one product over all of
the batch's tokens. Without gradients (decoding, validation) nn.GRU's own inference kernels
are faster, and on a GPU cuDNN's fused RNN is: `Encoder` keeps nn.GRU there.

Packing without a PackedSequence: rows arrive sorted by decreasing length
(`nmt.batching.collate` sorts them), so the rows still running at position t are a prefix,
the first n_t. The backward direction reads each row from its last piece to its first
(`_Run.flip`), so both directions run t = 0 … S−1 on the same prefix, from zero states, as
a packed nn.GRU does; a finished row's state stays where it was written. Padding positions
get zero states. Products in autocast's dtype when autocast is on; gate arithmetic and
saved states in float32. tests/test_encoder_loop.py compares it with nn.GRU over a packed
sequence: states, final states and every gradient.

Shape legend: B batch, S source length, E embedding size, H hidden size per direction,
n_t rows longer than t.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from torch import Tensor, nn

from nmt import onednn
from nmt.gru_cell import gru_gates, gru_gates_back
from nmt.runtime import autocast_dtype


def applies(rnn: nn.Module, emb: Tensor, lens: Tensor) -> TypeGuard[nn.GRU]:
    """Whether `encoder_loop` can stand in for `rnn` here: a 1-layer bidirectional nn.GRU
    (not a quantized one) on the CPU, gradients recorded, rows sorted by decreasing length,
    none empty. lens: (B,) int64 on the CPU."""
    return (
        type(rnn) is nn.GRU
        and rnn.num_layers == 1
        and rnn.bidirectional
        and rnn.bias
        and emb.device.type == "cpu"
        and torch.is_grad_enabled()
        and bool((lens[:-1] >= lens[1:]).all())
        and int(lens[-1]) > 0
    )


def encoder_loop(rnn: nn.GRU, emb: Tensor, lens: Tensor) -> tuple[Tensor, Tensor]:
    """What `rnn` (see `applies`) gives for `emb` packed with `lens`, padded back.

    emb (B, S, E); lens (B,) int64 on the CPU, sorted decreasing, all > 0.
    Returns states (B, S, 2H) float32, zeros on padding, forward and backward directions
    concatenated; final (2, B, H): each direction's last state, as nn.GRU gives it.
    """
    running = (lens.unsqueeze(0) > torch.arange(emb.size(1)).unsqueeze(1)).sum(1).tolist()
    return _Encode.apply(emb, lens, running, *rnn.all_weights[0], *rnn.all_weights[1])


class _Encode(torch.autograd.Function):
    """`encoder_loop` with gradients: the forward keeps a `_Run`, the backward consumes it."""

    @staticmethod
    def forward(ctx: Any, emb: Tensor, lens: Tensor, running: list[int], *weights: Tensor):
        # weights: w_ih, w_hh, b_ih, b_hh of the forward direction, then of the backward one
        run = _Run(emb, lens, running, weights)
        states, final = run.forward()
        ctx.run = run
        ctx.set_materialize_grads(False)  # an unused output (the final states) gives None
        return states, final

    @staticmethod
    def backward(ctx: Any, g_states: Tensor | None, g_final: Tensor | None):
        run: _Run = ctx.run
        ctx.run = None  # free the saved steps as soon as the backward is done
        g_emb, *g_weights = run.backward(g_states, g_final)
        return g_emb, None, None, *g_weights


class _Run:
    """One batch's pass: the forward's saved steps and the backward that consumes them."""

    def __init__(
        self, emb: Tensor, lens: Tensor, running: list[int], weights: tuple[Tensor, ...]
    ) -> None:
        self.cdt = autocast_dtype("cpu")  # the products' dtype, cast here once; else float32
        self.emb, self.lens, self.running = emb, lens, running
        self.weights = weights
        w_ih_f, w_hh_f, b_ih_f, b_hh_f, w_ih_b, w_hh_b, b_ih_b, b_hh_b = weights
        self.w_ih = self._c(torch.cat([w_ih_f, w_ih_b]))  # (6H, E) both directions
        self.b_ih = self._c(torch.cat([b_ih_f, b_ih_b]))  # (6H,)
        self.w_hh = self._c(torch.stack([w_hh_f, w_hh_b]))  # (2, 3H, H)
        self.b_hh = self._c(torch.stack([b_hh_f, b_hh_b]).unsqueeze(1))  # (2, 1, 3H)
        self.size = w_hh_f.size(1)  # H
        # The backward direction reads each row backwards from its last piece: position t
        # of row i is its piece lens_i − 1 − t, so both directions run t = 0 … S−1 on the
        # same prefix of rows. Padding positions stay where they are.
        B, S = emb.size(0), emb.size(1)
        t = torch.arange(S)
        last = (lens - 1).unsqueeze(1)  # (B, 1)
        self.flip = torch.where(t < lens.unsqueeze(1), last - t, t)  # (B, S) its own inverse
        self.row = torch.arange(B).unsqueeze(1)  # (B, 1)
        self.saved: list[dict[str, Tensor]] = []

    def _c(self, x: Tensor) -> Tensor:
        """x in the products' dtype."""
        return x if self.cdt is None else x.to(self.cdt)

    def _bmm(self, a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
        """Both directions' products: a (2, N, K) @ b (2, K, M) (+ bias (2, 1, M)) -> (2, N, M)
        float32. In float32, two oneDNN products (`nmt.onednn`: 1.7× faster here than one
        batched product through the BLAS)."""
        if self.cdt is None and onednn.applies(a, b):
            biases = (None, None) if bias is None else (bias[0, 0], bias[1, 0])
            return torch.stack([onednn.linear(a[d], b[d].t(), biases[d]) for d in (0, 1)])
        a, b = self._c(a), self._c(b)
        return (torch.bmm(a, b) if bias is None else torch.baddbmm(bias, a, b)).float()

    def _flipped(self, x: Tensor) -> Tensor:
        """x (B, S, X) with each row's real pieces in reverse order (one gather)."""
        return x[self.row, self.flip]

    def forward(self) -> tuple[Tensor, Tensor]:
        B, S, H = self.emb.size(0), self.emb.size(1), self.size
        gi = onednn.product(self.cdt, self.emb.flatten(0, 1), self.w_ih, self.b_ih).view(
            B, S, 6 * H
        )
        gi = torch.stack([gi[..., : 3 * H], self._flipped(gi[..., 3 * H :])])  # (2, B, S, 3H)
        out = gi.new_zeros(2, B, S, H)  # (2, B, S, H) each direction in its reading order
        h = gi.new_zeros(2, B, H)  # (2, B, H) a row's state before its first piece
        w_hh_t = self.w_hh.transpose(1, 2)  # (2, H, 3H)
        for t in range(S):
            n = self.running[t]
            h = h[:, :n]  # (2, n, H) finished rows leave, their states kept in `out`
            gh = self._bmm(h, w_hh_t, self.b_hh)  # (2, n, 3H)
            s: dict[str, Tensor] = {}
            h = gru_gates(gi[:, :n, t], gh, h, s)  # (2, n, H)
            self.saved.append(s)
            out[:, :n, t] = h
        final = out[:, torch.arange(B), self.lens - 1]  # (2, B, H) at each row's last piece
        states = torch.cat([out[0], self._flipped(out[1])], dim=-1)  # (B, S, 2H)
        return states, final

    def backward(self, g_states: Tensor | None, g_final: Tensor | None) -> tuple[Tensor, ...]:
        B, S, H = self.emb.size(0), self.emb.size(1), self.size
        g_out = None  # (2, B, S, H) in each direction's reading order
        if g_states is not None:
            g_states = g_states.float()
            g_out = torch.stack([g_states[..., :H], self._flipped(g_states[..., H:])])
        # a row's final state's gradient joins at its last piece (its first, walking back)
        joining = self.emb.new_zeros(2, B, H, dtype=torch.float32)
        if g_final is not None:
            joining = g_final.float()  # (2, B, H)
        d_gi = joining.new_zeros(2, B, S, 3 * H)  # (2, B, S, 3H)
        dh = joining[:, :0]  # (2, rows so far, H) into each row's state from later pieces
        d_gh_rows, h_rows = [], []
        for t in reversed(range(S)):
            n, s = self.running[t], self.saved[t]
            dh = dh if dh.size(1) == n else torch.cat([dh, joining[:, dh.size(1) : n]], dim=1)
            if g_out is not None:
                dh = dh + g_out[:, :n, t]  # (2, n, H)
            d_gi_t, d_gh, d_h = gru_gates_back(dh, s)  # (2, n, 3H), (2, n, 3H), (2, n, H)
            d_gi[:, :n, t] = d_gi_t
            dh = d_h + self._bmm(d_gh, self.w_hh)  # (2, n, H)
            d_gh_rows.append(d_gh)
            h_rows.append(s["h"])
        d_gh_all = torch.cat(d_gh_rows, dim=1)  # (2, Σn_t, 3H)
        h_all = torch.cat(h_rows, dim=1)  # (2, Σn_t, H)
        g_w_hh = torch.stack(  # (2, 3H, H)
            [onednn.weight_grad(self.cdt, d_gh_all[d], h_all[d]) for d in (0, 1)]
        )
        g_b_hh = d_gh_all.sum(1)  # (2, 3H)
        d_gi_flat = torch.cat([d_gi[0], self._flipped(d_gi[1])], dim=-1).flatten(0, 1)
        g_emb = onednn.product(self.cdt, d_gi_flat, self.w_ih.t()).view_as(self.emb)  # (B, S, E)
        g_w_ih = onednn.weight_grad(self.cdt, d_gi_flat, self.emb.flatten(0, 1))  # (6H, E)
        g_b_ih = d_gi_flat.sum(0)  # (6H,)
        ordered = (
            *(g_w_ih[: 3 * H], g_w_hh[0], g_b_ih[: 3 * H], g_b_hh[0]),
            *(g_w_ih[3 * H :], g_w_hh[1], g_b_ih[3 * H :], g_b_hh[1]),
        )
        return g_emb.to(self.emb.dtype), *(
            g.to(w.dtype) for g, w in zip(ordered, self.weights, strict=True)
        )
