"""The bidirectional GRU encoder with a hand-written backward: the training fast path on CPUs;
and the same loop in one direction from a given state, for the Luong decoder without input
feeding (`decoder_gru`), whose GRU reads the target embeddings alone.

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
sequence: states, final states and every gradient, and `decoder_gru` with nn.GRU from an
initial state, that state's gradient included.

Shape legend: B batch, S sequence length (the target's for `decoder_gru`), E embedding size,
H hidden size per direction, D directions (2; 1 for `decoder_gru`), n_t rows longer than t.
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
        _loop_gru(rnn, emb)
        and rnn.bidirectional
        and bool((lens[:-1] >= lens[1:]).all())
        and int(lens[-1]) > 0
    )


def _loop_gru(rnn: nn.Module, emb: Tensor) -> TypeGuard[nn.GRU]:
    """What both uses of the loop need: a 1-layer nn.GRU with biases (not a quantized one),
    on the CPU, gradients recorded (without them nn.GRU's inference kernels are faster)."""
    return (
        type(rnn) is nn.GRU
        and rnn.num_layers == 1
        and rnn.bias
        and emb.device.type == "cpu"
        and torch.is_grad_enabled()
    )


def decoder_applies(rnn: nn.Module, emb: Tensor) -> TypeGuard[nn.GRU]:
    """Whether `decoder_gru` stands in for `rnn` here: a 1-layer one-direction nn.GRU (not a
    quantized one) on the CPU, gradients recorded, products in float32.

    Why float32 only: there nn.GRU's products go to MKL (`nmt.onednn`) and it sums each
    weight's gradient a step at a time, and the loop is 1.8× faster (64 × 16 steps, 256 → 512:
    30.6 against 55.7 ms forward and backward, 2 cores of an AMD EPYC). Under bf16 autocast
    nn.GRU's products already run in oneDNN, and the loop's saving on them goes into its own
    copies (the steps' gradients gathered for the weight products): 23.1 against 22.3 ms."""
    return _loop_gru(rnn, emb) and not rnn.bidirectional and autocast_dtype("cpu") is None


def decoder_gru(rnn: nn.GRU, emb: Tensor, h0: Tensor) -> Tensor:
    """What `rnn(emb, h0)[0]` gives (see `decoder_applies`): emb (B, T, E), h0 (1, B, H) ->
    states (B, T, H) float32, every row run for all T steps (the loss ignores padding)."""
    B, T = emb.size(0), emb.size(1)
    lens = torch.full((B,), T, dtype=torch.long)
    return _Encode.apply(emb, lens, [B] * T, h0, *rnn.all_weights[0])[0]


def encoder_loop(rnn: nn.GRU, emb: Tensor, lens: Tensor) -> tuple[Tensor, Tensor]:
    """What `rnn` (see `applies`) gives for `emb` packed with `lens`, padded back.

    emb (B, S, E); lens (B,) int64 on the CPU, sorted decreasing, all > 0.
    Returns states (B, S, 2H) float32, zeros on padding, forward and backward directions
    concatenated; final (2, B, H): each direction's last state, as nn.GRU gives it.
    """
    running = (lens.unsqueeze(0) > torch.arange(emb.size(1)).unsqueeze(1)).sum(1).tolist()
    return _Encode.apply(emb, lens, running, None, *rnn.all_weights[0], *rnn.all_weights[1])


class _Encode(torch.autograd.Function):
    """`encoder_loop` and `decoder_gru` with gradients: the forward keeps a `_Run`, the
    backward consumes it."""

    @staticmethod
    def forward(
        ctx: Any, emb: Tensor, lens: Tensor, running: list[int], h0: Tensor | None, *weights: Tensor
    ):
        # weights: w_ih, w_hh, b_ih, b_hh of the forward direction, then of the backward one
        # if there is one; h0 (1, B, H) the one direction's first state, or None: zeros
        run = _Run(emb, lens, running, weights, h0)
        states, final = run.forward()
        ctx.run = run
        ctx.set_materialize_grads(False)  # an unused output (the final states) gives None
        return states, final

    @staticmethod
    def backward(ctx: Any, g_states: Tensor | None, g_final: Tensor | None):
        run: _Run = ctx.run
        ctx.run = None  # free the saved steps as soon as the backward is done
        g_emb, g_h0, *g_weights = run.backward(g_states, g_final)
        return g_emb, None, None, g_h0, *g_weights


class _Run:
    """One batch's pass: the forward's saved steps and the backward that consumes them."""

    def __init__(
        self,
        emb: Tensor,
        lens: Tensor,
        running: list[int],
        weights: tuple[Tensor, ...],
        h0: Tensor | None = None,
    ) -> None:
        self.cdt = autocast_dtype("cpu")  # the products' dtype, cast here once; else float32
        self.emb, self.lens, self.running, self.h0 = emb, lens, running, h0
        self.weights = weights
        self.dirs = len(weights) // 4  # D: 2 (the encoder) or 1 (`decoder_gru`)
        w_ih, w_hh, b_ih, b_hh = (weights[i::4] for i in range(4))  # each direction's
        self.w_ih = self._c(torch.cat(w_ih))  # (D·3H, E) all directions
        self.b_ih = self._c(torch.cat(b_ih))  # (D·3H,)
        self.w_hh = self._c(torch.stack(w_hh))  # (D, 3H, H)
        self.b_hh = self._c(torch.stack(b_hh).unsqueeze(1))  # (D, 1, 3H)
        self.size = w_hh[0].size(1)  # H
        # The backward direction reads each row backwards from its last piece: position t
        # of row i is its piece lens_i − 1 − t, so both directions run t = 0 … S−1 on the
        # same prefix of rows. Padding positions stay where they are. (One direction: none.)
        if self.dirs == 2:
            t = torch.arange(emb.size(1))
            last = (lens - 1).unsqueeze(1)  # (B, 1)
            self.flip = torch.where(t < lens.unsqueeze(1), last - t, t)  # (B, S) own inverse
            self.row = torch.arange(emb.size(0)).unsqueeze(1)  # (B, 1)
        self.saved: list[dict[str, Tensor]] = []

    def _c(self, x: Tensor) -> Tensor:
        """x in the products' dtype."""
        return x if self.cdt is None else x.to(self.cdt)

    def _bmm(self, a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
        """All directions' products: a (D, N, K) @ b (D, K, M) (+ bias (D, 1, M)) -> (D, N, M)
        float32. In float32, one oneDNN product a direction (`nmt.onednn`: 1.7× faster here
        than one batched product through the BLAS)."""
        if self.dirs == 1:  # one 2-D product, through oneDNN in float32, nothing to stack
            b_1 = None if bias is None else bias[0, 0]
            return onednn.product(self.cdt, a[0], b[0].t(), b_1).unsqueeze(0)
        if self.cdt is None and onednn.applies(a, b):
            dirs = range(self.dirs)
            biases = [None if bias is None else bias[d, 0] for d in dirs]
            return torch.stack([onednn.linear(a[d], b[d].t(), biases[d]) for d in dirs])
        a, b = self._c(a), self._c(b)
        return (torch.bmm(a, b) if bias is None else torch.baddbmm(bias, a, b)).float()

    def _flipped(self, x: Tensor) -> Tensor:
        """x (B, S, X) with each row's real pieces in reverse order (one gather)."""
        return x[self.row, self.flip]

    def forward(self) -> tuple[Tensor, Tensor]:
        B, S, H = self.emb.size(0), self.emb.size(1), self.size
        gi = onednn.product(self.cdt, self.emb.flatten(0, 1), self.w_ih, self.b_ih)  # (B·S, D·3H)
        gi = gi.view(B, S, self.dirs * 3 * H)
        gi = self._by_direction(gi, 3 * H)  # (D, B, S, 3H)
        out = gi.new_zeros(self.dirs, B, S, H)  # (D, B, S, H) each direction in its reading order
        h = gi.new_zeros(self.dirs, B, H) if self.h0 is None else self.h0.float()  # (D, B, H)
        w_hh_t = self.w_hh.transpose(1, 2)  # (D, H, 3H)
        for t in range(S):
            n = self.running[t]
            h = h[:, :n]  # (D, n, H) finished rows leave, their states kept in `out`
            gh = self._bmm(h, w_hh_t, self.b_hh)  # (D, n, 3H)
            s: dict[str, Tensor] = {}
            h = gru_gates(gi[:, :n, t], gh, h, s, out=out[:, :n, t])  # (D, n, H)
            self.saved.append(s)
        final = out[:, torch.arange(B), self.lens - 1]  # (D, B, H) at each row's last piece
        if self.dirs == 1:
            return out[0], final  # (B, S, H)
        return torch.cat([out[0], self._flipped(out[1])], dim=-1), final  # (B, S, 2H)

    def _by_direction(self, x: Tensor, size: int) -> Tensor:
        """x (B, S, D·size), directions side by side as the layers lay them out -> (D, B, S,
        size), each direction in its reading order."""
        if self.dirs == 1:
            return x.unsqueeze(0)  # a view
        return torch.stack([x[..., :size], self._flipped(x[..., size:])])

    def _side_by_side(self, x: Tensor) -> Tensor:
        """`_by_direction`'s inverse: (D, B, S, size) -> (B, S, D·size)."""
        return x[0] if self.dirs == 1 else torch.cat([x[0], self._flipped(x[1])], dim=-1)

    def backward(
        self, g_states: Tensor | None, g_final: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        B, S, H = self.emb.size(0), self.emb.size(1), self.size
        D = self.dirs
        g_out = None  # (D, B, S, H) in each direction's reading order
        if g_states is not None:
            g_out = self._by_direction(g_states.float(), H)
        # a row's final state's gradient joins at its last piece (its first, walking back)
        joining = self.emb.new_zeros(D, B, H, dtype=torch.float32)
        if g_final is not None:
            joining = g_final.float()  # (D, B, H)
        d_gi = joining.new_zeros(D, B, S, 3 * H)  # (D, B, S, 3H)
        # every step's d_gh and h, step t's n_t rows at its own offset, for the weight product
        ends = torch.tensor(self.running).cumsum(0).tolist()  # step t's rows end here
        d_gh_all = joining.new_empty(D, ends[-1], 3 * H)  # (D, Σn_t, 3H)
        h_rows = []
        dh = joining[:, :0]  # (D, rows so far, H) into each row's state from later pieces
        for t in reversed(range(S)):
            n, s = self.running[t], self.saved[t]
            dh = dh if dh.size(1) == n else torch.cat([dh, joining[:, dh.size(1) : n]], dim=1)
            if g_out is not None:
                dh = dh + g_out[:, :n, t]  # (D, n, H)
            slots = (d_gi[:, :n, t], d_gh_all[:, ends[t] - n : ends[t]])
            _, d_gh, d_h = gru_gates_back(dh, s, slots)  # (D, n, 3H), (D, n, 3H), (D, n, H)
            dh = d_h + self._bmm(d_gh, self.w_hh)  # (D, n, H)
            h_rows.append(s["h"])
        h_all = torch.cat(h_rows[::-1], dim=1)  # (D, Σn_t, H) in time order
        g_w_hh = [onednn.weight_grad(self.cdt, d_gh_all[d], h_all[d]) for d in range(D)]
        g_b_hh = d_gh_all.sum(1)  # (D, 3H)
        d_gi_flat = self._side_by_side(d_gi).flatten(0, 1)  # (B·S, D·3H)
        g_emb = onednn.product(self.cdt, d_gi_flat, self.w_ih.t()).view_as(self.emb)  # (B, S, E)
        g_w_ih = onednn.weight_grad(self.cdt, d_gi_flat, self.emb.flatten(0, 1))  # (D·3H, E)
        g_b_ih = d_gi_flat.sum(0)  # (D·3H,)
        ordered = []  # as `self.weights`: w_ih, w_hh, b_ih, b_hh a direction
        for d in range(D):
            rows = slice(d * 3 * H, (d + 1) * 3 * H)  # direction d's gates
            ordered += [g_w_ih[rows], g_w_hh[d], g_b_ih[rows], g_b_hh[d]]
        # dh: the gradient into the states before the first piece (all rows run at t = 0)
        g_h0 = None if self.h0 is None else dh.to(self.h0.dtype)  # (1, B, H)
        return (
            g_emb.to(self.emb.dtype),
            g_h0,
            *(g.to(w.dtype) for g, w in zip(ordered, self.weights, strict=True)),
        )
