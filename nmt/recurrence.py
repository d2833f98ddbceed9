"""The teacher-forced decoder loop with a hand-written backward: the training fast path.

Why: autograd through a per-step loop records some forty operators per time step, and sums
each weight's gradient one step at a time (T products of B rows and T additions per
weight). `decoder_loop` runs the same arithmetic as `LuongDecoder`/`BahdanauDecoder`'s
step-by-step path without recording, keeps what the backward needs, and its backward walks
the steps in reverse computing only what depends on the next step. Every weight gradient is
then one product over all B·T rows, as cuDNN's RNNs do; the input half of the gates that
depends on the target embeddings only is computed outside, once for all steps. The rows
those products read (the states, Luong's outputs and [c; h], the gates' gradients) are
written by each step into its slot of a (T, B, ·) buffer, not concatenated afterwards: about
28 MB of copies less for a batch of 64 × 18 targets of the reference model (2 cores of a
Xeon with AMX: its backward 1.06-1.26× faster; the bf16 step 1.03-1.06×, the fp32 step
0.97-1.08×, within that machine's noise; docs/benchmarks.md, session 25).
tests/test_recurrence.py compares both paths, values and gradients.

Covers a 1-layer GRU decoder with any single-head scorer, global or local (Luong's local-m
and local-p windows, `nmt.local_attention`'s own functions; local-p's position predictor
gets its gradient here too). The attention
weights it returns carry a gradient (copy attention's loss reads them); a loss that does not
read them costs nothing for it (no gradient is materialised). Inside, matrix products run
in the autocast dtype when autocast is on (weights cast once per batch, not once per step)
and the gate arithmetic, softmax and saved states in float32, as cuDNN does for
half-precision RNNs. The attention's per-sentence products (a dot scorer's scores, the
context, and their gradients) stay float32: B matrix-vector products a step, which the
CPU's batched-product kernels run 2-5× slower in bf16 than in float32 (`row_dots`).

Shape legend: B batch, T target steps, S source length, H decoder hidden size, R the size of
the recurrent input's non-embedding part (Luong: H, the fed-back output; Bahdanau: Dv, the
context), Dp projected key size, Dv value size, A the concat scorer's hidden size.
"""

# long: one forward and its hand-written backward, step by step, for two decoders, four
# scorers and local attention; split, each half would need the other's saved names.

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt import onednn, vml
from nmt.attention import (
    Attention,
    BilinearAttention,
    ConcatAttention,
    DotAttention,
    ScaledDotAttention,
    additive_hidden,
    from_sigmoid,
    masked_softmax,
)
from nmt.gru_cell import (
    gru_gates,
    gru_gates_back,
    sigmoid_backward,
    tanh_backward,
    tanh_backward_into,
)
from nmt.local_attention import centres_monotonic, window_mask
from nmt.runtime import autocast_dtype, autocast_off


@dataclass
class Scorer:
    """The attention parameters the loop needs: concat's (w_q, b_q, v) or none (dot-like,
    scores = scale · q·k against keys already projected by `project_keys`)."""

    scale: float = 1.0
    w_q: Tensor | None = None  # (A, H) concat's query projection
    b_q: Tensor | None = None  # (A,)
    v: Tensor | None = None  # (1, A)
    # where attention may look (nmt.local_attention): global, or a window of D positions
    # either side of p_t = t (local_m) or of a predicted p_t (local_p: W_p, v_p)
    scope: str = "global"
    width: int = 0
    w_p: Tensor | None = None  # (H, H)
    v_p: Tensor | None = None  # (1, H)

    @property
    def static(self) -> tuple[float, str, int]:
        """What `_Run` takes besides tensors."""
        return self.scale, self.scope, self.width


def row_dots(m: Tensor, x: Tensor) -> Tensor:
    """m (B, S, D) float32, x (B, D) float32 -> (B, S): each row of m[b] dotted with x[b].

    Why not `torch.bmm(m, x.unsqueeze(2))`: a batch of matrix-vector products with one output
    column takes the batched-product kernel's slow path, 218 µs at 64 × 19 × 512 against
    42 for this multiply and sum (2 cores, AMD EPYC Zen 5; bf16 operands 104)."""
    return (m * x.unsqueeze(1)).sum(-1)


class _Loop(torch.autograd.Function):
    """`decoder_loop` with gradients: the forward keeps a `_Run`, the backward consumes it."""

    @staticmethod
    def forward(
        ctx: Any, static: tuple[float, str, int], gi_emb: Tensor, h0: Tensor, *params: Any
    ) -> tuple[Tensor, ...]:
        # params: w_ir, w_hh, b_hh, w_c, b_c, w_q, b_q, v, w_p, v_p, keys, values, mask,
        # feed_mask (`_Run`)
        run = _Run(static, *params)
        outs = run.forward(gi_emb, h0, keep=True)
        ctx.run = run
        ctx.dtypes = (gi_emb.dtype, h0.dtype, run.keys_in.dtype, run.values_in.dtype)
        ctx.set_materialize_grads(False)  # unused outputs (the weights, mostly) give None
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        run: _Run = ctx.run
        ctx.run = None  # free the saved steps as soon as the backward is done
        *g_weights, g_keys, g_values = run.backward(grads)
        g_gi, g_h0, *g_params = g_weights
        dt_gi, dt_h0, dt_k, dt_v = ctx.dtypes
        return (
            None,
            g_gi.to(dt_gi),
            g_h0.to(dt_h0),
            *g_params,  # w_ir, w_hh, b_hh, w_c, b_c, w_q, b_q, v, w_p, v_p
            g_keys.to(dt_k),
            g_values.to(dt_v),
            None,  # mask
            None,  # feed_mask
        )


class _Run:
    """One batch's pass: the forward's saved steps and the backward that consumes them.
    Luong's when `w_c` (its output layer) is given, Bahdanau's otherwise; Luong's output is
    tanh(W_c u), or W_c u + b_c (linear, no tanh) when its bias `b_c` is given."""

    def __init__(
        self,
        static: tuple[float, str, int],
        w_ir: Tensor,
        w_hh: Tensor,
        b_hh: Tensor,
        w_c: Tensor | None,
        b_c: Tensor | None,
        w_q: Tensor | None,
        b_q: Tensor | None,
        v: Tensor | None,
        w_p: Tensor | None,
        v_p: Tensor | None,
        keys: Tensor,
        values: Tensor,
        mask: Tensor,
        feed_mask: Tensor | None = None,
    ) -> None:
        # Autocast's dtype for products, cast here once; float32 everywhere else.
        self.cdt = autocast_dtype(keys.device.type)
        self.scale, self.scope, self.width = static
        self.mask = mask
        self.feed_mask = feed_mask  # (T, B, H) Luong's h̃ dropped: 0 or 1/(1 − p); None: kept
        self.params = (w_ir, w_hh, b_hh, w_c, b_c, w_q, b_q, v, w_p, v_p)
        # w_ir is a column slice of the GRU's input weight: copied once a batch, as every
        # step reads it (`nmt.onednn.dense`)
        self.w_ir, self.w_hh = self._c(w_ir).contiguous(), self._c(w_hh)
        self.w_c = None if w_c is None else self._c(w_c)
        self.b_c = None if b_c is None else b_c.float()  # (H,) a linear output's bias
        self.w_q = None if w_q is None else self._c(w_q)
        self.b_hh = self._c(b_hh)
        self.b_q = None if b_q is None else self._c(b_q)
        self.v = None if v is None else v.float().squeeze(0)  # (A,)
        self.v_sum = None if self.v is None else self.v.sum()  # Σv, once a batch (`from_sigmoid`)
        self.v4 = None if self.v is None else 4 * self.v  # (A,) the backward's factor 4v
        self.w_p = None if w_p is None else self._c(w_p)  # local-p's predictor
        self.v_p = None if v_p is None else v_p.float().squeeze(0)  # (H,)
        self.var = (self.width / 2) ** 2  # local-p's Gaussian: σ² = (D/2)²
        self.lengths = mask.sum(-1)  # (B,) real lengths
        self.last = (self.lengths - 1).clamp(min=0).float()  # (B,) local-p: L − 1, once a batch
        self.keys_in, self.values_in = keys, values
        self.keys, self.values = keys.float(), values.float()  # (B, S, Dp), (B, S, Dv)
        self.saved: list[dict[str, Tensor]] = []
        self.steps: dict[str, Tensor] = {}  # (T, B, ·) what the forward wrote in place

    def _c(self, x: Tensor) -> Tensor:
        """x in the products' dtype."""
        return x if self.cdt is None else x.to(self.cdt)

    def _mm(self, x: Tensor, w: Tensor) -> Tensor:
        """x (N, in) @ wᵀ with w (out, in) already cast -> (N, out) float32."""
        return onednn.product(self.cdt, x, w)

    def _attend(self, q: Tensor, t: int, s: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """query (B, H) at step t -> context (B, Dv), weights (B, S); saves what the backward
        needs."""
        if self.w_q is None:
            scores = row_dots(self.keys, q)  # (B, S)
            scores = scores * self.scale if self.scale != 1.0 else scores  # (B, S)
        else:
            assert self.b_q is not None and self.v is not None and self.v_sum is not None
            qp = onednn.product(self.cdt, q, self.w_q, self.b_q)  # (B, A)
            sig, sigmoid = additive_hidden(qp.unsqueeze(1), self.keys)  # (B, S, A) σ(2qp + 2k)
            assert sigmoid  # the loop's elementwise work is float32: the backward reads σ
            scores = from_sigmoid(sig @ self.v, self.v_sum)  # (B, S) vᵀ tanh(qp + k)
            s["sig"] = sig
        mask = self.mask  # (B, S)
        if self.scope != "global":
            scores, mask = self._window(q, t, scores, s)
        alpha = masked_softmax(scores, mask)  # (B, S) float32
        context = torch.bmm(alpha.unsqueeze(1), self.values).squeeze(1)  # (B, Dv) float32
        s["q"], s["alpha"] = q, alpha
        return context, alpha  # (B, Dv), (B, S)

    def _window(
        self, q: Tensor, t: int, scores: Tensor, s: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Local attention at step t (`nmt.local_attention.LocalScope`): the mask (B, S) cut
        to |s − p_t| <= D, with p_t = t (local-m) or (L − 1) σ(v_pᵀ tanh(W_p q)) (local-p,
        whose scores (B, S) gain −(s − p_t)²/2σ²)."""
        if self.w_p is None or self.v_p is None:  # local-m
            centres = centres_monotonic(self.lengths, t, 1)  # (B, 1)
            return scores, window_mask(centres, self.mask, self.width)[0].squeeze(1)
        u = vml.tanh(self._mm(q, self.w_p))  # (B, H)
        share = torch.sigmoid(u @ self.v_p)  # (B,)
        window, offsets = window_mask((share * self.last).unsqueeze(1), self.mask, self.width)
        offsets = offsets.squeeze(1)  # (B, S) s − p_t
        s.update(p_u=u, p_share=share, p_offsets=offsets)  # p_: the predictor's
        return scores - offsets**2 / (2 * self.var), window.squeeze(1)

    def _window_back(self, ds: Tensor, s: dict[str, Tensor], acc: dict[str, list]) -> Tensor:
        """Gradient of the windowed scores (B, S) -> the query's share through p (B, H)."""
        assert self.w_p is not None and self.v_p is not None
        u, share = s["p_u"], s["p_share"]
        dp = (ds * s["p_offsets"]).sum(-1) / self.var  # (B,) d/dp of −(s − p)²/2σ²
        dz = dp * self.last * share * (1 - share)  # (B,)
        d_pre = tanh_backward(dz.unsqueeze(1) * self.v_p, u)  # (B, H)
        acc["d_pre_p"].append(d_pre)
        acc["d_vp"].append(dz @ u)  # (H,)
        return self._mm(d_pre, self.w_p.t())  # (B, H)

    def _gru(self, gi: Tensor, h: Tensor, x: Tensor, s: dict[str, Tensor], out: Tensor) -> Tensor:
        """gi (B, 3H) input gates from the embedding, h (B, H), x (B, R) -> new h (B, H),
        written into `out`."""
        gi = gi + self._mm(x, self.w_ir)  # (B, 3H)
        gh = onednn.product(self.cdt, h, self.w_hh, self.b_hh)  # (B, 3H)
        s["x"] = x
        return gru_gates(gi, gh, h, s, out=out)

    def forward(self, gi_emb: Tensor, h0: Tensor, *, keep: bool) -> tuple[Tensor, ...]:
        """gi_emb (B, T, 3H) = emb W_ie + b_ih, h0 (B, H).

        Luong: h̃ (B, T, H), weights (B, T, S). Bahdanau: s (B, T, H), contexts (B, T, Dv),
        weights (B, T, S).

        Autocast is off inside: the weight products cast to `cdt` themselves (`_mm`), and
        autocast would otherwise run the attention's float32 products (vᵀσ, the context's
        `bmm`) in bf16, casting a (B, S, ·) tensor every step and rounding the scores.
        """
        with autocast_off(self.keys.device.type):
            return self._forward(gi_emb, h0, keep=keep)

    def _forward(self, gi_emb: Tensor, h0: Tensor, *, keep: bool) -> tuple[Tensor, ...]:
        gi_emb = gi_emb.float()
        (B, T), H, w_c = gi_emb.shape[:2], h0.size(1), self.w_c
        luong = w_c is not None
        # Every step's state, and Luong's outputs h̃ and [c; h], written where the weight
        # gradients read them as (T·B, ·) rows: no concatenation of the steps in the backward.
        hs = h0.new_empty(T + 1, B, H, dtype=torch.float32)  # h_0 … h_T
        hs[0] = h0
        feeds = hs.new_zeros(T + 1 if luong else 0, B, H)  # h̃_0 = 0, h̃_1 … h̃_T
        us = hs.new_empty(T if luong else 0, B, self.values.size(2) + H)  # [c_t; h_t]
        contexts, weights = [], []
        for t in range(T):
            s: dict[str, Tensor] = {}
            if w_c is not None:  # Luong
                h = self._gru(gi_emb[:, t], hs[t], feeds[t], s, out=hs[t + 1])
                context, alpha = self._attend(h, t, s)
                u = torch.cat([context, h], dim=-1, out=us[t])  # (B, Dv + H)
                pre = self._mm(u, w_c)  # (B, H)
                drop, slot = self.feed_mask, feeds[t + 1]
                if self.b_c is None:  # h̃_t = tanh(W_c u): its backward reads h̃_t as computed,
                    # kept apart from the slot when the slot gets the dropped one
                    out = vml.tanh(pre, out=slot if drop is None else None)
                    s["out"] = out
                else:  # linear: its backward reads no output, so the slot is dropped in place
                    out = torch.add(pre, self.b_c, out=slot)
                if drop is not None:  # the dropped h̃_t: returned and fed back
                    torch.mul(out, drop[t], out=slot)
                s["u"] = u
            else:
                context, alpha = self._attend(hs[t], t, s)  # attends with s_{t-1}
                self._gru(gi_emb[:, t], hs[t], context, s, out=hs[t + 1])
                contexts.append(context)
            weights.append(alpha)
            if keep:
                self.saved.append(s)
        self.steps = {"h": hs[:T], "q": hs[1:] if luong else hs[:T]}
        if luong:
            self.steps.update(x=feeds[:T], u=us)
        out = (feeds if luong else hs)[1:].transpose(0, 1).contiguous()  # (B, T, H)
        alphas = torch.stack(weights, dim=1)  # (B, T, S)
        if luong:
            return out, alphas
        return out, torch.stack(contexts, dim=1), alphas

    def _attend_back(
        self, dc: Tensor, g_alpha: Tensor | None, s: dict[str, Tensor], acc: dict[str, list]
    ) -> Tensor:
        """Gradients of the context (B, Dv) and of the weights (B, S) from outside (copy
        attention; None: unused) -> gradient of the query (B, H)."""
        alpha = s["alpha"]
        d_alpha = row_dots(self.values, dc)  # (B, S)
        if g_alpha is not None:
            d_alpha = d_alpha + g_alpha
        ds = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))  # (B, S) softmax'
        acc["dc"].append(dc)
        d_q = None if self.w_p is None else self._window_back(ds, s, acc)  # (B, H) via p
        if self.w_q is None:
            ds = ds * self.scale if self.scale != 1.0 else ds
            acc["ds"].append(ds)
            d_q_scores = torch.bmm(ds.unsqueeze(1), self.keys).squeeze(1)  # (B, Dp = H)
            return d_q_scores if d_q is None else d_q_scores + d_q
        sig = s["sig"].flatten(0, 1)  # (B·S, A) σ(2x), tanh(x) = 2σ − 1
        assert self.v4 is not None
        # d/dx of vᵀtanh(x) = v ⊙ 4σ(1 − σ). The factor 4v is the same for every pair and
        # step, so it is applied to the sums over S (here) and over steps (`_weight_grads`):
        # the (B, S, A) work a step is one pass writing ds·σ(1 − σ), its sum, and its addition.
        slope = sigmoid_backward(ds.unsqueeze(2), s["sig"])  # (B, S, A) ds σ(1 − σ)
        d_qp = slope.sum(1) * self.v4  # (B, A)
        # Σ ds·tanh = 2 σᵀds − Σds over the batch's B·S pairs: (A,)
        if acc["d_keys"]:
            acc["d_keys"][0].add_(slope)  # (B, S, A) summed over steps, 4v to come
            acc["d_v"][0].addmv_(sig.t(), ds.flatten(), alpha=2).sub_(ds.sum())  # (A,)
        else:
            acc["d_keys"].append(slope)
            acc["d_v"].append(torch.addmv(-ds.sum(), sig.t(), ds.flatten(), alpha=2))  # (A,)
        acc["d_qp"].append(d_qp)
        d_q_scores = self._mm(d_qp, self.w_q.t())  # (B, H)
        return d_q_scores if d_q is None else d_q_scores + d_q

    def _gru_back(
        self, dh: Tensor, s: dict[str, Tensor], out: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Gradient of the new h (B, H) -> gradients of h (B, H) and x (B, R); those of gi and
        gh (B, 3H) written into `out`, the step's slots."""
        d_gi, d_gh, d_h = gru_gates_back(dh, s, out)  # (B, 3H), (B, 3H), (B, H)
        d_h = d_h + self._mm(d_gh, self.w_hh.t())  # (B, H)
        d_x = self._mm(d_gi, self.w_ir.t())  # (B, R)
        return d_h, d_x

    def backward(self, grads: tuple[Tensor | None, ...]) -> tuple[Tensor, ...]:
        """grads: of each output of `forward`, the weights last; None for an unused one."""
        steps = self.saved
        first = steps[0]["h"]
        B, H, T = first.size(0), first.size(1), len(steps)

        def grad_of(i: int, size: int) -> Tensor:  # (B, T, size): an unused output gets none
            g = grads[i]
            return first.new_zeros(B, T, size) if g is None else g.float()

        g_out = grad_of(0, H)  # (B, T, H)
        g_ctx = None if self.w_c is not None else grad_of(1, self.values.size(2))  # (B, T, Dv)
        g_w = grads[-1]  # (B, T, S) or None

        def g_alpha(t: int) -> Tensor | None:
            return None if g_w is None else g_w[:, t].float()

        names = ("dc", "ds", "d_qp", "d_keys", "d_v", "d_pre_p", "d_vp")
        acc: dict[str, list] = {k: [] for k in names}
        # each step's gradients written into its slot of the weight gradients' rows
        d_gi, d_gh = first.new_empty(2, T, B, 3 * H)  # (T, B, 3H) each, time order
        d_c = first.new_empty(T if self.w_c is not None else 0, B, H)  # Luong's into W_c u
        dh = first.new_zeros(B, H)  # into h_t from step t + 1
        d_feed = first.new_zeros(B, H)  # Luong: into h̃_t from step t + 1
        for t in reversed(range(T)):
            s, slots = steps[t], (d_gi[t], d_gh[t])
            if self.w_c is not None:  # Luong
                d_pre = torch.add(g_out[:, t], d_feed, out=d_c[t])  # (B, H) into h̃_t
                if self.feed_mask is not None:  # through the dropout: into h̃_t before it
                    d_pre.mul_(self.feed_mask[t])
                if self.b_c is None:
                    d_pre = tanh_backward_into(d_pre, s["out"], grad_input=d_c[t])
                du = self._mm(d_pre, self.w_c.t())  # (B, Dv + H)
                dv = self.values.size(2)
                dh = dh + du[:, dv:] + self._attend_back(du[:, :dv], g_alpha(t), s, acc)
                dh, d_feed = self._gru_back(dh, s, slots)
            else:
                dh, d_x = self._gru_back(dh + g_out[:, t], s, slots)
                assert g_ctx is not None
                dh = dh + self._attend_back(d_x + g_ctx[:, t], g_alpha(t), s, acc)
        return self._weight_grads(acc, (d_gi, d_gh, d_c), dh)

    def _weight_grads(self, acc: dict[str, list], slots: tuple[Tensor, ...], dh0: Tensor) -> tuple:
        """Each weight's gradient as one product over all B·T rows (steps in time order).
        slots: the backward's (T, B, ·) gradients of gi, gh and (Luong) W_c u."""
        steps = self.saved

        def rows(key: str) -> Tensor:  # (T·B, ...) in time order
            if key in self.steps:  # written in place by the forward
                return self.steps[key].flatten(0, 1)
            return torch.cat([s[key] for s in steps], dim=0)

        def back(key: str) -> Tensor:  # collected during the backward: reversed time order
            return torch.cat(acc[key][::-1], dim=0)

        def wgrad(d: Tensor, x: Tensor) -> Tensor:  # dᵀ x, in the products' dtype
            return onednn.weight_grad(self.cdt, d, x)

        w_ir, w_hh, b_hh, w_c, b_c, w_q, b_q, v, w_p, v_p = self.params
        d_gi, d_gh, d_c = (x.flatten(0, 1) for x in slots)  # (T·B, 3H) twice, (T·B, H)
        g_w_ir = wgrad(d_gi, rows("x")).to(w_ir.dtype)
        g_w_hh = wgrad(d_gh, rows("h")).to(w_hh.dtype)
        g_b_hh = d_gh.sum(0).to(b_hh.dtype)
        g_w_c = g_b_c = None
        if w_c is not None:
            g_w_c = wgrad(d_c, rows("u")).to(w_c.dtype)
            g_b_c = None if b_c is None else d_c.sum(0).to(b_c.dtype)
        alpha = torch.stack([s["alpha"] for s in steps], dim=1)  # (B, T, S)
        dc = torch.stack(acc["dc"][::-1], dim=1)  # (B, T, Dv)
        g_values = torch.bmm(alpha.transpose(1, 2), dc)  # (B, S, Dv)
        g_w_q = g_b_q = g_v = None
        if w_q is None:
            ds = torch.stack(acc["ds"][::-1], dim=1)  # (B, T, S)
            q = torch.stack([s["q"] for s in steps], dim=1)  # (B, T, H)
            g_keys = torch.bmm(ds.transpose(1, 2), q)  # (B, S, H); the scale is in ds
        else:
            assert b_q is not None and v is not None and self.v4 is not None
            g_keys = acc["d_keys"][0].mul_(self.v4)  # (B, S, A) the factor held back
            d_qp = back("d_qp")  # (T·B, A)
            g_w_q = wgrad(d_qp, rows("q")).to(w_q.dtype)
            g_b_q = d_qp.sum(0).to(b_q.dtype)
            g_v = acc["d_v"][0].unsqueeze(0).to(v.dtype)  # (1, A)
        g_w_p = g_v_p = None
        if w_p is not None and v_p is not None:  # local-p's predictor
            g_w_p = wgrad(back("d_pre_p"), rows("q")).to(w_p.dtype)
            g_v_p = torch.stack(acc["d_vp"]).sum(0).unsqueeze(0).to(v_p.dtype)  # (1, H)
        g_gi = slots[0].transpose(0, 1)  # (B, T, 3H)
        weights = (g_w_ir, g_w_hh, g_b_hh, g_w_c, g_b_c, g_w_q, g_b_q, g_v, g_w_p, g_v_p)
        return g_gi, dh0, *weights, g_keys, g_values


def scorer_of(attention: Attention) -> Scorer | None:
    """What `decoder_loop` needs of a scorer and its scope; None for one it does not know
    (several heads among them)."""
    scorer = None
    if isinstance(attention, ConcatAttention):
        q, v = attention.query_proj, attention.v
        scorer = Scorer(w_q=q.weight, b_q=q.bias, v=v.weight)
    elif isinstance(attention, ScaledDotAttention):
        scorer = Scorer(scale=attention.scale)
    elif isinstance(attention, (DotAttention, BilinearAttention)):
        scorer = Scorer()
    scope = attention.scope
    if scorer is None or scope is None:
        return scorer
    w_p = None if scope.w_p is None else scope.w_p.weight
    v_p = None if scope.v_p is None else scope.v_p.weight
    return dataclasses.replace(scorer, scope=scope.kind, width=scope.width, w_p=w_p, v_p=v_p)


def decoder_loop(
    *,
    gi_emb: Tensor,
    h0: Tensor,
    w_ir: Tensor,
    w_hh: Tensor,
    b_hh: Tensor,
    w_c: Tensor | None,
    b_c: Tensor | None,
    scorer: Scorer,
    keys: Tensor,
    values: Tensor,
    mask: Tensor,
    feed_mask: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Run a 1-layer GRU decoder over all target steps (teacher forcing).

    gi_emb (B, T, 3H): the embedding's part of the input gates plus b_ih, for all steps.
    h0 (B, H) initial state; w_ir (3H, R) the input weight's other columns; w_hh (3H, H),
    b_hh (3H,); w_c (H, Dv + H) Luong's output layer, None for a Bahdanau decoder; b_c (H,)
    its bias where the output is linear (W_c u + b_c, no tanh), None for Luong's tanh.
    keys (B, S, Dp), values (B, S, Dv), mask (B, S) bool as for `Attention.forward`.
    feed_mask (T, B, H) float32: Luong's h̃_t multiplied by it, the product returned and fed
    back (OpenNMT-py's dropout placement); None: h̃ as computed.
    Returns Luong: h̃ (B, T, H), weights (B, T, S); Bahdanau: s (B, T, H), contexts
    (B, T, Dv), weights (B, T, S).
    """
    sc = scorer
    weights = (w_ir, w_hh, b_hh, w_c, b_c, sc.w_q, sc.b_q, sc.v, sc.w_p, sc.v_p)
    args = (*weights, keys, values, mask, feed_mask)
    if not torch.is_grad_enabled():  # validation: nothing to save
        run = _Run(sc.static, *args)
        return run.forward(gi_emb, h0, keep=False)
    return _Loop.apply(sc.static, gi_emb, h0, *args)
