"""The training loops' concat scorer (and GRU gates) fused by hand, measured: one of issue
25's levers ("fewer, larger operators by hand"), kept out of nmt.

Each step of `nmt.recurrence`'s loop runs the additive scorer over a (B, S, A) tensor: the
forward as an add, a sigmoid and a matrix-vector product (three passes), the backward as
σ'(·), a sum over S, an accumulation and a matrix-vector product (four). Here both are one C++
pass each (`scripts/fused_kernels.py`), compiled at run time into a temporary folder (removed
at exit), and swapped into the loop in place of those operators; with `--parts
scorer,gates` the GRU gates' five operators a step (forward) and seven (backward) are one
pass each too, in both the decoder's and the encoder's loops. Given a config, the script
reads its model, data and batches first (a problem with any of them is one line before the
build). It then checks that the fused loops give the loops' outputs and gradients, times the
scorer alone at the reference shapes, and times each real training batch with the kernels
off and on, in alternating order (`scripts/profile_step.py --paired`).

    .venv/bin/python scripts/bench_fused_scorer.py [--parts scorer,gates] \
        [configs/reference_rnn.yaml --set data.root=../shared/data \
        --checkpoint RUN/step-1000.pt --precision fp32 --steps 100]
    .venv/bin/python scripts/bench_fused_scorer.py --decode RUN/step-1000.pt \
        --src ../shared/data/multi30k/test_2016_flickr.en [--beams 1,5] [--workers 2]

`--decode` instead times decoding a file (int8, in worker processes, as compare_peers.py's
--int8 rows) with decoding's scorer vᵀ tanh(q + k) in one pass (`dec`) and without,
alternated.

Why not in nmt (docs/benchmarks.md, session 38): on 2 cores of a Xeon with AMX the scorer
made the training step 3 % faster in fp32 and 4-5 % in bf16 (the gates too: 3.6 % and
5.4 %), and decoding 0-6 %, for a C++ compiler at install or first use and half a minute of
compiling. Needs g++ (or the compiler torch's extensions use). Only one benchmark at a time
on a small machine: two at once make both figures wrong.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import profile_step
import torch
from argtypes import sentence_lines, some_of, whole, wholes
from bench_output_layer import median_us
from fused_kernels import NAMES, compiled
from torch import Tensor

from nmt import encoder_loop, onednn
from nmt import recurrence as rec
from nmt.attention import ConcatAttention, additive_hidden, from_sigmoid, masked_softmax
from nmt.config import load_config
from nmt.errors import one_line
from nmt.gru_cell import gru_gates, gru_gates_back, sigmoid_backward
from nmt.runtime import resolve_device
from nmt.translate import Translator


class Lever:
    """The fused kernels swapped in while `on`, for the `parts` asked for: into
    `nmt.recurrence._Run` for a global concat scorer, into both loops' calls of the GRU gates
    (training), and into `ConcatAttention` for decoding in float32 on the CPU; the operators
    otherwise (and for every other scorer)."""

    def __init__(self, ext: Any, parts: set[str]) -> None:
        self.ext, self.parts, self.on = ext, parts, False
        self.attend, self.attend_back = rec._Run._attend, rec._Run._attend_back
        rec._Run._attend, rec._Run._attend_back = self._attend(), self._attend_back()
        self.hidden_scores = ConcatAttention._hidden_scores
        ConcatAttention._hidden_scores = self._hidden_scores()
        for loop in (rec, encoder_loop):  # the names the two loops call
            loop.gru_gates, loop.gru_gates_back = self._gates(), self._gates_back()  # type: ignore[attr-defined]

    def switch(self, on: bool) -> None:
        self.on = on

    def _gates(self) -> Callable:
        def gates(gi: Tensor, gh: Tensor, h: Tensor, s: dict, out: Tensor | None = None) -> Tensor:
            if not (self.on and "gates" in self.parts and _rows(gi, gh, h, out)):
                return gru_gates(gi, gh, h, s, out=out)
            assert out is not None
            rz, n = self.ext.gates(*(_3d(x) for x in (gi, gh, h, out)))  # (P, N, 2H), (P, N, H)
            size = h.size(-1)
            rz, n = rz.view(*h.shape[:-1], 2 * size), n.view(h.shape)
            s.update(h=h, rz=rz, n=n, gh_n=gh[..., 2 * size :], gh=gh)  # both backwards' names
            return out

        return gates

    def _gates_back(self) -> Callable:
        def gates_back(dh: Tensor, s: dict, out: tuple[Tensor, Tensor] | None = None) -> tuple:
            if not (self.on and "gh" in s and out is not None and _rows(dh, *out)):
                return gru_gates_back(dh, s, out)
            d_gi, d_gh = out
            saved = (s["rz"], s["n"], s["h"], s["gh"])
            dh_z = self.ext.gates_back(*(_3d(x) for x in (dh, *saved, d_gi, d_gh)))
            return d_gi, d_gh, dh_z.view(dh.shape)

        return gates_back

    def _hidden_scores(self) -> Callable:
        def hidden_scores(att: ConcatAttention, q: Tensor, keys: Tensor) -> tuple[Tensor, bool]:
            floats = q.dtype == keys.dtype == torch.float32 and q.device.type == "cpu"
            whole = q.size(0) * q.size(1) % keys.size(0) == 0  # each sentence's rows together
            if not (self.on and floats and whole and not torch.is_grad_enabled()):
                return self.hidden_scores(att, q, keys)
            B, T, A = q.shape  # (B, T, A) against keys (B', S, A): B·T / B' rows a sentence
            v = att.v.weight.reshape(-1).float().contiguous()  # (A,)
            rows = q.reshape(B * T, A).contiguous()
            scores = self.ext.dec(rows, keys.contiguous(), v, B * T // keys.size(0))
            return scores.view(B, T, -1), False  # (B, T, S) of tanh, not σ

        return hidden_scores

    def _applies(self, run: rec._Run) -> bool:
        return self.on and "scorer" in self.parts and run.w_q is not None and run.scope == "global"

    def _attend(self) -> Callable:
        def attend(run: rec._Run, q: Tensor, t: int, s: dict[str, Tensor]) -> tuple:
            if not self._applies(run):
                return self.attend(run, q, t, s)
            assert run.v is not None and run.w_q is not None
            qp = onednn.product(run.cdt, q, run.w_q, run.b_q).contiguous()  # (B, A)
            keys = run.keys.contiguous()  # (B, S, A)
            s["sig"], scores = self.ext.fwd(qp, keys, run.v.contiguous())
            alpha = masked_softmax(scores, run.mask)  # (B, S)
            context = torch.bmm(alpha.unsqueeze(1), run.values).squeeze(1)  # (B, Dv)
            s["q"], s["alpha"] = q, alpha
            return context, alpha

        return attend

    def _attend_back(self) -> Callable:
        def attend_back(run: rec._Run, dc: Tensor, g_alpha: Any, s: dict, acc: dict) -> Tensor:
            if not self._applies(run):
                return self.attend_back(run, dc, g_alpha, s, acc)
            assert run.w_q is not None and run.v4 is not None
            alpha = s["alpha"]
            d_alpha = rec.row_dots(run.values, dc)  # (B, S)
            if g_alpha is not None:
                d_alpha = d_alpha + g_alpha
            ds = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))  # (B, S)
            acc["dc"].append(dc)
            first = not acc["d_keys"]
            if first:  # the sums over steps, written by the kernel from the last step on
                acc["d_keys"].append(torch.empty_like(s["sig"]))  # (B, S, A)
                acc["d_v"].append(ds.new_zeros(s["sig"].size(2)))  # (A,)
            keys_grad, v_grad = acc["d_keys"][0], acc["d_v"][0]
            d_qp = self.ext.bwd(ds.contiguous(), s["sig"], keys_grad, v_grad, run.v4, first)
            acc["d_qp"].append(d_qp)  # (B, A)
            return run._mm(d_qp, run.w_q.t())  # (B, H)

        return attend_back


def _rows(*tensors: Tensor | None) -> bool:
    """Whether the gates' kernels take these: float32 CPU tensors of 2 or 3 dimensions whose
    rows are contiguous."""
    return all(
        x is not None
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.dim() in (2, 3)
        and x.stride(-1) == 1
        for x in tensors
    )


def _3d(x: Tensor) -> Tensor:
    """(N, ·) -> (1, N, ·), a view; (P, N, ·) as it is."""
    return x if x.dim() == 3 else x.unsqueeze(0)


class _Counted:
    """An extension whose calls are counted, by kernel."""

    def __init__(self, ext: Any) -> None:
        self.ext, self.calls = ext, Counter[str]()

    def __getattr__(self, name: str) -> Callable:
        kernel = getattr(self.ext, name)

        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return kernel(*args)

        return counted


def check(lever: Lever) -> None:
    """The decoder loop with all the kernels against without, on a small batch with padding:
    outputs, attention weights and every gradient; the encoder loop's; decoding's scores.
    Exit 1 past a float32 tolerance, or where a kernel was never called (nmt's loops no
    longer call what the lever replaces, and the comparison would be of nmt against itself)."""
    parts, lever.parts = lever.parts, set(PARTS)
    ext = lever.ext = _Counted(lever.ext)
    torch.manual_seed(0)
    B, T, S, H, A = 8, 6, 7, 32, 24

    def leaf(*shape: int) -> Tensor:
        return (torch.randn(*shape) * 0.3).requires_grad_()

    gi, h0, keys, values = leaf(B, T, 3 * H), leaf(B, H), leaf(B, S, A), leaf(B, S, H)
    w_ir, w_hh, b_hh, w_c, b_c = (
        leaf(3 * H, H),
        leaf(3 * H, H),
        leaf(3 * H),
        leaf(H, 2 * H),
        leaf(H),
    )
    scorer = rec.Scorer(w_q=leaf(A, H), b_q=leaf(A), v=leaf(1, A))
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[0, 5:] = False
    leaves = [gi, h0, w_ir, w_hh, b_hh, w_c, b_c, scorer.w_q, scorer.b_q, scorer.v, keys, values]
    found = []
    for on in (False, True):
        lever.switch(on)
        out, alpha = rec.decoder_loop(
            gi_emb=gi, h0=h0, w_ir=w_ir, w_hh=w_hh, b_hh=b_hh, w_c=w_c, b_c=b_c,
            scorer=scorer, keys=keys, values=values, mask=mask,
        )  # fmt: skip
        grads = torch.autograd.grad(out.sin().sum() + alpha.square().sum(), leaves)
        found.append([out.detach(), alpha.detach(), *grads, *_decoding_scores(H, A)])
        found[-1] += _encoder(B, S, H)
    lever.switch(False)
    lever.parts, lever.ext = parts, ext.ext
    unused = [name for name in NAMES if not ext.calls[name]]
    if unused:
        raise SystemExit(f"error: the loops never called the fused {', '.join(unused)}")
    worst = max(float((a - b).abs().max()) for a, b in zip(*found, strict=True))
    print(f"fused against the loops' operators: largest difference {worst:.2e}")
    if worst > 1e-4:
        raise SystemExit("error: the fused kernels do not give the loops' values")


def _encoder(B: int, S: int, H: int) -> list[Tensor]:
    """`nmt.encoder_loop`'s bidirectional GRU on a padded batch: its states, final states and
    every gradient."""
    torch.manual_seed(2)
    gru = torch.nn.GRU(H, H, batch_first=True, bidirectional=True)
    emb = torch.randn(B, S, H, requires_grad=True)
    lens = torch.arange(S, S - B, -1).clamp(min=1)  # (B,) sorted decreasing
    states, final = encoder_loop.encoder_loop(gru, emb, lens)
    leaves = [emb, *gru.parameters()]
    grads = torch.autograd.grad(states.sin().sum() + final.square().sum(), leaves)
    return [states.detach(), final.detach(), *grads]


def _decoding_scores(H: int, A: int) -> list[Tensor]:
    """A concat scorer's decoding scores (no gradient): a greedy step's (B, 1, S) and a beam's
    three hypotheses a sentence sharing its keys (B, 3, S)."""
    torch.manual_seed(1)
    att = ConcatAttention(query_size=H, key_size=H, hidden_size=A)
    keys = att.project_keys(torch.randn(4, 7, H))  # (B, S, A)
    with torch.inference_mode():
        return [att.score(torch.randn(4, rows, H), keys) for rows in (1, 3)]


def scorer_alone(lever: Lever, rows: int, length: int, hidden: int, threads: list[int]) -> None:
    """One step's scorer, forward and backward, with the loop's operators and fused."""
    torch.manual_seed(0)
    qp, keys = torch.randn(rows, hidden), torch.randn(rows, length, hidden)
    v = torch.randn(hidden) * 0.1
    v_sum, v4, ds = v.sum(), 4 * v, torch.randn(rows, length)
    d_keys, d_v = torch.zeros_like(keys), torch.zeros(hidden)
    sig = lever.ext.fwd(qp, keys, v)[0]

    def ops_forward() -> Any:
        sig, _ = additive_hidden(qp.unsqueeze(1), keys)  # (B, S, A)
        return from_sigmoid(sig @ v, v_sum)

    def ops_backward() -> Any:  # as `_Run._attend_back` after the first step
        slope = sigmoid_backward(ds.unsqueeze(2), sig)  # (B, S, A)
        d_keys.add_(slope)
        d_v.addmv_(sig.flatten(0, 1).t(), ds.flatten(), alpha=2).sub_(ds.sum())
        return slope.sum(1) * v4

    cases = {
        "forward": (ops_forward, lambda: lever.ext.fwd(qp, keys, v)),
        "backward": (ops_backward, lambda: lever.ext.bwd(ds, sig, d_keys, d_v, v4, False)),
    }
    print(f"one step's scorer at {rows} × {length} × {hidden}, µs (operators / fused):")
    for n in threads:
        torch.set_num_threads(n)
        us = {k: (median_us(a, 300), median_us(b, 300)) for k, (a, b) in cases.items()}
        said = [f"{k} {ops:.0f} / {fused:.0f}" for k, (ops, fused) in us.items()]
        print(f"  {n} thread{'s' if n > 1 else ''}: " + ", ".join(said))


def decoding(lever: Lever, tr: Translator, lines: list[str], beams: list[int], pairs: int) -> None:
    """`lines` decoded whole by `tr` with the kernel off and on, in alternating order: the
    medians, the median per-pair ratio, and how many translations the kernel's rounding
    changed."""
    workers = tr.workers

    def texts(beam: int) -> list[str]:
        return [h.text for h in tr.translate(lines, beam=beam, batch_size=64)]

    for beam in beams:
        found = {}
        for on in (False, True):
            lever.switch(on)
            found[on] = texts(beam)
        changed = sum(a != b for a, b in zip(found[False], found[True], strict=True))
        seconds = profile_step.alternated(lambda _, b=beam: texts(b), lever.switch, range(pairs))
        ratios = [a / b for a, b in zip(seconds[False], seconds[True], strict=True)]
        off, on = (statistics.median(seconds[k]) for k in (False, True))
        print(
            f"beam {beam}, {workers} worker(s), {pairs} pairs: operators {off:.3f} s, fused "
            f"{on:.3f} s; per pair {statistics.median(ratios):.3f}x ({min(ratios):.3f}-"
            f"{max(ratios):.3f}); {changed} of {len(lines)} translations changed"
        )


PARTS = ("scorer", "gates")  # the concat scorer's kernels, the GRU gates'


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Any other arguments go to scripts/profile_step.py (a config first), which then "
        "times each batch with the kernel off and on.",
    )
    ap.add_argument("--rows", type=whole(1), default=64, help="sentences a batch")
    ap.add_argument("--length", type=whole(1), default=15, help="source positions")
    ap.add_argument("--hidden", type=whole(1), default=512, help="the scorer's A")
    ap.add_argument("--threads", type=wholes(1), default="1,2")
    ap.add_argument(
        "--parts",
        type=some_of(PARTS),
        default="scorer",
        help=f"the kernels the training lever swaps in: of {','.join(PARTS)}",
    )
    ap.add_argument("--decode", type=Path, metavar="CHECKPOINT", help="time decoding instead")
    ap.add_argument("--src", type=Path, help="--decode's source file")
    ap.add_argument("--beams", type=wholes(1), default="1,5")
    ap.add_argument("--workers", type=whole(1), default=2, help="--decode's processes")
    ap.add_argument("--pairs", type=whole(1), default=8, help="--decode's alternated pairs")
    args, step_args = ap.parse_known_args()
    if args.decode and (step_args or not args.src):
        ap.error("--decode takes --src FILE, and no training step's arguments")
    levers: list[Lever] = []  # the one, once compiled
    step_argv = [*step_args, "--paired", "fused"]
    if step_args:  # the step's arguments and config (then its data: `ready`) checked first
        profile_step.LEVERS["fused"] = lambda model: levers[0].switch
        step = profile_step.arguments(step_argv)
        device = resolve_device(load_config(step.config, overrides=step.set).train.device)
        if device.type != "cpu":  # the kernels read CPU memory
            raise SystemExit(
                f"error: the fused scorer runs on the CPU, not {device}: add --set train.device=cpu"
            )
    if args.decode:  # the model and the file read before compiling; int8 as compare_peers'
        lines = sentence_lines(args.src, "--src")
        tr = Translator.from_checkpoint(args.decode, "cpu", int8=True, workers=args.workers)

    def ready() -> None:  # built and checked once the step's model and data are in hand
        threads = torch.get_num_threads()
        with tempfile.TemporaryDirectory(prefix="nmt-fused-scorer-") as build:
            levers.append(Lever(compiled(build), set(args.parts)))
        check(levers[0])
        scorer_alone(levers[0], args.rows, args.length, args.hidden, args.threads)
        torch.set_num_threads(threads)

    if step_args:
        profile_step.main(step_argv, ready)
        return
    ready()
    if args.decode:
        decoding(levers[0], tr, lines, args.beams, args.pairs)


if __name__ == "__main__":
    with one_line():  # a config, checkpoint or data problem
        main()
