"""The teacher-forced decoder loop's step compiled by `torch.compile`, forward and backward,
measured: issue 25's first lever ("a hand-written cell that torch.compile can trace"), kept
out of nmt.

`nmt.recurrence._Run` runs each target step as some forty eager operators forward and as many
backward, between its matrix products. Here a step's forward (the GRU's two products and
gates, the concat scorer, the softmax, the context, [c; h] and the linear output layer) is
one Python function, and its hand-written backward another, both compiled by Inductor with
dynamic shapes (`dynamic=True`: one graph for every batch size and source length) and swapped
into the loop for the reference model's decoder (Luong, input feeding, global concat
attention, linear output). Inductor fuses the elementwise work and the casts around the
products into C++ loops; the products stay library calls: bf16 through oneDNN as autocast's,
float32 through `nmt.onednn.linear` (an opaque operator here, so that Inductor does not send
them to MKL's generic path on AMD's CPUs). Given a config, the script reads its model, data
and batches first (a problem with any of them is one line before any compiling). It then
checks the compiled loop against the operators' (outputs, attention weights and every
gradient, float32 and bf16, a padded batch), and times each real training batch with the
lever off and on in alternating order (`scripts/profile_step.py --paired`). Inductor's cache
goes to a temporary folder, removed at exit: every run compiles from scratch.

    .venv/bin/python scripts/bench_compiled_step.py [configs/reference_rnn.yaml \
        --set data.root=../shared/data --checkpoint RUN/step-1000.pt --precision bf16 --steps 100]

Why not in nmt (docs/benchmarks.md, session 44): on 2 cores of an AMD EPYC Zen 4 the whole
training step ran 1.045-1.054x faster per batch in bf16 and 0.999x in float32 (medians over
100 real batches), after some 20 s of compiling in each process (the forward, the backward,
and a recompile or two for the first step's shapes) and with a C++ compiler needed at run
time: what session 38's hand-written kernels gave. Each compiled call pays some 130 µs of
Dynamo's guard checks, and Inductor's loops over the scorer's (B, S, A) tensors are not much
faster than ATen's operators. Only one benchmark at a time on a small
machine: two at once make both figures wrong.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from typing import Any

import profile_step
import torch
from argtypes import some_of
from torch import Tensor

from nmt import onednn
from nmt import recurrence as rec
from nmt.attention import additive_hidden, from_sigmoid, masked_softmax
from nmt.config import load_config
from nmt.errors import one_line
from nmt.gru_cell import gru_gates, sigmoid_backward
from nmt.runtime import resolve_device


@torch.library.custom_op("nmt_bench::linear", mutates_args=())
def _linear(x: Tensor, w: Tensor) -> Tensor:
    """x (N, in) @ w (out, in)ᵀ in float32 as nmt's loops run it (`nmt.onednn.linear`),
    opaque to Inductor."""
    return onednn.linear(x, w)


@_linear.register_fake
def _(x: Tensor, w: Tensor) -> Tensor:
    return x.new_empty(x.size(0), w.size(0))


def product(x: Tensor, w: Tensor, cdt: torch.dtype | None, b: Tensor | None = None) -> Tensor:
    """x (N, in) @ w (out, in)ᵀ + b -> (N, out) float32: in `cdt` (autocast's, w and b already
    cast) as `nmt.onednn.product`, or with cdt None in float32."""
    if cdt is None:
        y = _linear(x, w)
        return y if b is None else y + b
    x = x.to(cdt)
    return (x @ w.t() if b is None else torch.addmm(b, x, w.t())).float()


def forward_step(
    gi_t: Tensor, h: Tensor, x: Tensor, w: dict[str, Tensor], keys: Tensor, values: Tensor,
    mask: Tensor, out: tuple[Tensor, Tensor, Tensor], cdt: torch.dtype | None,
) -> tuple[Tensor, ...]:  # fmt: skip
    """One step of `_Run._forward` (Luong, global concat, linear output): gi_t (B, 3H) the
    embedding's gates, h (B, H) the state, x (B, H) the fed-back output -> rz (B, 2H), n (B, H),
    gh_n (B, H), σ (B, S, A), weights (B, S); the new state, [c; h] and the new output written
    into `out`, their slots in the loop's buffers."""
    gi = gi_t + product(x, w["ir"], cdt)  # (B, 3H)
    gh = product(h, w["hh"], cdt, w["b_hh"])  # (B, 3H)
    s: dict[str, Tensor] = {}
    h_new = gru_gates(gi, gh, h, s, out=out[0])  # (B, H) nmt's gates, traced
    qp = product(h_new, w["q"], cdt, w["b_q"])  # (B, A)
    sig, _ = additive_hidden(qp.unsqueeze(1), keys)  # (B, S, A) σ(2qp + 2k), float32
    alpha = masked_softmax(from_sigmoid((sig * w["v"]).sum(-1), w["v_sum"]), mask)  # (B, S)
    context = (alpha.unsqueeze(2) * values).sum(1)  # (B, Dv)
    u = torch.cat([context, h_new], -1)  # (B, Dv + H)
    out[1].copy_(u)
    out[2].copy_(product(u, w["c"], cdt) + w["b_c"])  # (B, H) h̃
    return s["rz"], s["n"], s["gh_n"], sig, alpha


def backward_step(
    g: Tensor, d_feed: Tensor, dh: Tensor, s: dict[str, Tensor], w: dict[str, Tensor],
    values: Tensor, sums: tuple[Tensor, Tensor], out: tuple[Tensor, Tensor, Tensor],
    cdt: torch.dtype | None,
) -> tuple[Tensor, ...]:  # fmt: skip
    """One step of `_Run.backward` for `forward_step`'s model: g (B, H) the output's gradient
    from outside, d_feed (B, H) and dh (B, H) from step t + 1, s the step's saved tensors ->
    the context's gradient (B, Dv), the scorer's query gradient (B, A), and dh, d_feed for step
    t − 1. Adds into `sums` (the keys' (B, S, A) and v's (A,) gradients over steps, 4v to
    come) and writes W_c u's, gi's and gh's gradients into `out`, the step's slots."""
    H, Dv = dh.size(1), values.size(2)
    alpha, sig, rz, n = s["alpha"], s["sig"], s["rz"], s["n"]
    d_pre = g + d_feed  # (B, H) into h̃
    out[0].copy_(d_pre)
    du = product(d_pre, w["c"].t(), cdt)  # (B, Dv + H)
    dc = du[:, :Dv]  # (B, Dv)
    d_alpha = rec.row_dots(values, dc)  # (B, S)
    ds = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))  # (B, S) softmax'
    slope = sigmoid_backward(ds.unsqueeze(2), sig)  # (B, S, A) ds σ(1 − σ)
    d_qp = slope.sum(1) * w["v4"]  # (B, A)
    sums[0].add_(slope)
    sums[1].add_(2 * (sig * ds.unsqueeze(2)).sum((0, 1)) - ds.sum())  # (A,)
    dh = dh + du[:, Dv:] + product(d_qp, w["q"].t(), cdt)  # (B, H)
    # `nmt.gru_cell.gru_gates_back`'s arithmetic: it writes into column slices of its
    # outputs (out=), which Dynamo does not trace ("non-contiguous `out=` tensor")
    dh_z = dh * rz[:, H:]  # (B, H) h's own share
    d_n = (dh - dh_z) * (1 - n * n)  # (B, H)
    d_rz = torch.cat([d_n * s["gh_n"], dh * (s["h"] - n)], -1) * rz * (1 - rz)  # (B, 2H)
    d_gi, d_gh = torch.cat([d_rz, d_n], -1), torch.cat([d_rz, d_n * rz[:, :H]], -1)  # (B, 3H)
    out[1].copy_(d_gi)
    out[2].copy_(d_gh)
    dh = dh_z + product(d_gh, w["hh"].t(), cdt)  # (B, H)
    return dc, d_qp, dh, product(d_gi, w["ir"].t(), cdt)


class Lever:
    """The compiled steps swapped into `nmt.recurrence._Run` while `on`, where they apply (a
    Luong decoder with a global concat scorer and a linear output); the loop's own otherwise.
    `calls` counts the compiled forwards and backwards run."""

    def __init__(self) -> None:
        self.on, self.calls = False, {"forward": 0, "backward": 0}
        self.forward_step = torch.compile(forward_step, dynamic=True)
        self.backward_step = torch.compile(backward_step, dynamic=True)
        self.loop_forward, self.loop_backward = rec._Run._forward, rec._Run.backward
        rec._Run._forward, rec._Run.backward = self._forward(), self._backward()  # type: ignore[method-assign]

    def switch(self, on: bool) -> None:
        self.on = on

    def _applies(self, run: rec._Run) -> bool:
        return (
            self.on
            and None not in (run.w_q, run.w_c, run.b_c)
            and run.scope == "global"
            and run.keys.device.type == "cpu"
        )

    @staticmethod
    def _weights(run: rec._Run) -> dict[str, Any]:
        return dict(ir=run.w_ir, hh=run.w_hh, b_hh=run.b_hh, q=run.w_q, b_q=run.b_q, v=run.v,
                    v_sum=run.v_sum, v4=run.v4, c=run.w_c, b_c=run.b_c)  # fmt: skip

    def _forward(self) -> Callable:
        def forward(run: rec._Run, gi_emb: Tensor, h0: Tensor, *, keep: bool) -> tuple:
            if not self._applies(run):
                return self.loop_forward(run, gi_emb, h0, keep=keep)
            self.calls["forward"] += 1
            gi_emb, w = gi_emb.float(), self._weights(run)
            (B, T), H = gi_emb.shape[:2], h0.size(1)
            hs = h0.new_empty(T + 1, B, H, dtype=torch.float32)  # h_0 … h_T
            hs[0] = h0
            feeds = hs.new_zeros(T + 1, B, H)  # h̃_0 = 0, h̃_1 … h̃_T
            us = hs.new_empty(T, B, run.values.size(2) + H)  # [c_t; h_t]
            weights = []
            for t in range(T):
                slots = (hs[t + 1], us[t], feeds[t + 1])
                rz, n, gh_n, sig, alpha = self.forward_step(
                    gi_emb[:, t], hs[t], feeds[t], w, run.keys, run.values, run.mask, slots,
                    run.cdt,
                )  # fmt: skip
                weights.append(alpha)
                if keep:  # the names the loop's own backward reads too
                    run.saved.append(dict(h=hs[t], rz=rz, n=n, gh_n=gh_n, sig=sig, alpha=alpha))
            run.steps = {"h": hs[:T], "q": hs[1:], "x": feeds[:T], "u": us}
            return feeds[1:].transpose(0, 1).contiguous(), torch.stack(weights, dim=1)

        return forward

    def _backward(self) -> Callable:
        def backward(run: rec._Run, grads: tuple[Tensor | None, ...]) -> tuple[Tensor, ...]:
            # either forward saves what this reads; weights with a gradient (copy attention's)
            # take the loop's own backward
            if not (self._applies(run) and grads[-1] is None):
                return self.loop_backward(run, grads)
            self.calls["backward"] += 1
            saved, w = run.saved, self._weights(run)
            first = saved[0]["h"]
            B, H, T = first.size(0), first.size(1), len(saved)
            g_out = first.new_zeros(B, T, H) if grads[0] is None else grads[0].float()
            d_gi, d_gh = first.new_empty(2, T, B, 3 * H)  # (T, B, 3H) each, time order
            d_c = first.new_empty(T, B, H)  # into W_c u
            dh, d_feed = first.new_zeros(2, B, H)  # into h_t and h̃_t from step t + 1
            sums = (torch.zeros_like(saved[0]["sig"]), first.new_zeros(saved[0]["sig"].size(2)))
            acc: dict[str, list] = {k: [] for k in ("dc", "d_qp", "d_keys", "d_v")}
            for t in reversed(range(T)):
                dc, d_qp, dh, d_feed = self.backward_step(
                    g_out[:, t], d_feed, dh, saved[t], w, run.values, sums,
                    (d_c[t], d_gi[t], d_gh[t]), run.cdt,
                )  # fmt: skip
                acc["dc"].append(dc)
                acc["d_qp"].append(d_qp)
            acc["d_keys"], acc["d_v"] = [sums[0]], [sums[1]]
            return run._weight_grads(acc, (d_gi, d_gh, d_c), dh)

        return backward


# What the compiled steps are written for: the reference model's decoder (reference_rnn.yaml)
REFERENCE = dict(cell="gru", dec_layers=1, decoder="luong", input_feeding=True,
                 attention="concat", attention_scope="global", attention_heads=1,
                 attention_output="linear", copy=False)  # fmt: skip

CHECKS = {"fp32": (torch.float32, 1e-4), "bf16": (torch.bfloat16, 2e-2)}  # dtype, tolerance


def check(lever: Lever, dtypes: list[str]) -> None:
    """The decoder loop with the compiled steps against without, on a small padded batch, in
    float32 and bf16: outputs, attention weights and every gradient. Exit 1 past a tolerance
    (float32's or bf16's rounding), or where the compiled steps never ran (nmt's loop no
    longer calls what the lever replaces, and the comparison would be of nmt against itself)."""
    torch.manual_seed(0)
    B, T, S, H, A = 8, 6, 7, 32, 24

    def leaf(*shape: int) -> Tensor:
        return (torch.randn(*shape) * 0.3).requires_grad_()

    gi, h0, keys, values = leaf(B, T, 3 * H), leaf(B, H), leaf(B, S, A), leaf(B, S, H)
    w_ir, w_hh, b_hh, w_q = leaf(3 * H, H), leaf(3 * H, H), leaf(3 * H), leaf(A, H)
    w_c, b_c, b_q, v = leaf(H, 2 * H), leaf(H), leaf(A), leaf(1, A)
    scorer = rec.Scorer(w_q=w_q, b_q=b_q, v=v)
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[0, 5:], mask[3, 2:] = False, False
    leaves = [gi, h0, w_ir, w_hh, b_hh, w_c, b_c, w_q, b_q, v, keys, values]
    for dtype, tolerance in (CHECKS[name] for name in dtypes):
        found, lever.calls = [], dict.fromkeys(lever.calls, 0)
        for on in (False, True):
            lever.switch(on)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype != torch.float32):
                out, alpha = rec.decoder_loop(
                    gi_emb=gi, h0=h0, w_ir=w_ir, w_hh=w_hh, b_hh=b_hh, w_c=w_c, b_c=b_c,
                    scorer=scorer, keys=keys, values=values, mask=mask,
                )  # fmt: skip
            grads = torch.autograd.grad(out.float().sin().sum(), leaves)
            found.append([out.detach().float(), alpha.detach(), *grads])
        lever.switch(False)
        # each tensor's largest difference, against its own largest value
        worst = max(
            float((a - b).abs().max() / a.abs().max().clamp(min=1e-6))
            for a, b in zip(*found, strict=True)
        )
        print(f"{dtype}: compiled against the loop's operators: largest difference {worst:.2e}")
        if worst > tolerance:
            raise SystemExit(f"error: the compiled steps do not give the loop's values in {dtype}")
        if not all(lever.calls.values()):
            raise SystemExit(f"error: the compiled steps never ran in {dtype}: {lever.calls}")
    # the check's small shapes and plain tensors (not Parameters) would cost the real batches
    # recompiles, up to Dynamo's limit, past which it runs the steps eagerly
    torch._dynamo.reset()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Any other arguments go to scripts/profile_step.py (a config first), which then "
        "times each batch with the compiled steps off and on.",
    )
    ap.add_argument(
        "--check",
        type=some_of(CHECKS),
        default="fp32,bf16",
        help=f"the precisions the loops are compared in first: of {','.join(CHECKS)}",
    )
    args, step_args = ap.parse_known_args()
    step_argv = [*step_args, "--paired", "compiled"]
    levers: list[Lever] = []
    profile_step.LEVERS["compiled"] = lambda model: levers[0].switch
    if step_args:  # the step's arguments and model (then its data: `ready`) checked first
        step = profile_step.arguments(step_argv)
        cfg = load_config(step.config, overrides=step.set)
        unlike = [k for k, v in REFERENCE.items() if getattr(cfg.model, k) != v]
        if unlike:
            found = ", ".join(f"model.{k}: {getattr(cfg.model, k)}" for k in unlike)
            wanted = ", ".join(f"{k} {REFERENCE[k]}" for k in unlike)
            raise SystemExit(
                f"error: {step.config}: {found}: the compiled steps are the reference "
                f"decoder's ({wanted})"
            )
        if resolve_device(cfg.train.device).type != "cpu":
            raise SystemExit(f"error: {step.config}: the compiled steps run on the CPU: add "
                             "--set train.device=cpu")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="nmt-compiled-step-") as cache:
        # Inductor's cache, and its precompiled headers, which go to the temporary folder's
        # torchinductor_USER whatever the cache's setting: both read at the first compile
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        tempfile.tempdir = cache

        def ready() -> None:  # compiled and checked once the step's model and data are in hand
            levers.append(Lever())
            check(levers[0], args.check)
            levers[0].calls = dict.fromkeys(levers[0].calls, 0)

        if not step_args:
            ready()
            return
        profile_step.main(step_argv, ready)
        if not all(levers[0].calls.values()):  # a checkpoint's model unlike its config
            raise SystemExit(f"error: the compiled steps never ran: {levers[0].calls}")


if __name__ == "__main__":
    with one_line():  # a config, checkpoint or data problem
        main()
