"""Where a training step's time goes: real batches, the program's own update, torch.profiler.

Builds the model of a config (or loads a run's checkpoint: a trained model runs differently
from a fresh one, e.g. denormal floats), takes real length-bucketed batches of the training
split, times `nmt.step.update` over them and prints target tokens/s, then profiles a few
steps and prints the operators by self CPU time, grouped as in the README's profile table.

    .venv/bin/python scripts/profile_step.py configs/reference_rnn.yaml \
        --set data.root=../shared/data --precision fp32 [--checkpoint RUN/best.pt]

`--in-place` instead times each matrix product where the step runs it (a dispatch mode,
perf_counter around the call) against the same product timed alone as
`scripts/peers/limit.py` times the limit: how much of the distance to the limit is products
running below their own rate and how much is everything else. Run it after enough steps that
the heap has grown to the batches' sizes (`--steps 150`): fresh pages slow the first few
hundred steps' products down. `--share MINUTES` instead steps for that long, each step
followed by the limit's own products: the share of the limit with both timed in the same
seconds, a minute at a time, so that a shared machine's slow spells slow both
(`scripts/limit_in_step.py`). Both are CPU only (a GPU product returns at its launch).

`--count-syncs` instead counts, per update, the calls that make the host wait for a GPU
(`SyncCounter`: reading a value, a device copy, a data-dependent size), with where they are
made. On a GPU it counts calls on GPU tensors only; on a CPU there is no device to wait
for, so it counts every such call, host-side ones (the source lengths that packing reads
on the CPU by design) included, each with its call site: read them as an upper bound.

The data is prepared in the config's run folder only where nmt made it (and, with
`--checkpoint`, it holds the checkpoint's tokenizer): elsewhere in a temporary folder, in the
checkpoint's own pieces (`scripts/script_data.py`).

Only one benchmark at a time on a small machine: two at once make both figures wrong.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from argtypes import minutes, whole
from limit_in_step import in_place, same_moments
from script_data import trained
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from nmt import onednn, vml
from nmt.batching import collate, epoch_rows
from nmt.config import load_config
from nmt.errors import one_line
from nmt.runtime import (
    configure_device,
    resolve_device,
    resolve_precision,
    seed_everything,
)
from nmt.smoothing import Smoothed
from nmt.step import update

# Operator name -> the row of the README's table it is counted in.
_PRODUCTS = "matrix products (mm, addmm, bmm, oneDNN's linear)"
GROUPS = {
    "aten::mm": _PRODUCTS,
    "aten::addmm": _PRODUCTS,
    "aten::bmm": _PRODUCTS,
    "aten::baddbmm": _PRODUCTS,
    "mkldnn::_linear_pointwise": _PRODUCTS,  # float32 products (nmt.onednn)
    "aten::_log_softmax": "loss (log-softmax / cross entropy, forward + backward)",
    "aten::_log_softmax_backward_data": "loss (log-softmax / cross entropy, forward + backward)",
    "nmt::cross_entropy": "loss (log-softmax / cross entropy, forward + backward)",
    "aten::add": "add / add_",
    "aten::add_": "add / add_",
    "aten::fill_": "fill_ (zero-fills)",
    "aten::zero_": "fill_ (zero-fills)",
    "aten::copy_": "copy_ (casts, copies)",
    "aten::_to_copy": "copy_ (casts, copies)",
}


# Tensor methods and functions whose result the host must wait for when the tensor is on a
# GPU: a value read back, or a size that depends on the data.
_READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"}
_MOVES = {"to", "cpu", "cuda", "copy_"}  # copies that cross devices (host <-> GPU)


class SyncCounter(TorchFunctionMode):
    """Counts calls that synchronise the host with a GPU, by call site (file:line in nmt/).

    `device` is where the model runs: on a GPU, reads count only on its tensors and moves
    only between devices; on the CPU, every read and every move with a device argument
    counts (there is nothing to tell a would-be device tensor from a host one).
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.gpu = device.type == "cuda"
        self.sites: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _READS or name in _MOVES:
            tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if tensor is not None and self._counts(name, tensor, args[1:], kwargs):
                self.sites[f"{name} at {_site()}"] += 1
        return func(*args, **kwargs)

    def _counts(self, name: str, tensor: torch.Tensor, rest: Any, kwargs: Any) -> bool:
        if name in _READS:
            return tensor.is_cuda or not self.gpu
        if name == "cpu":
            return tensor.is_cuda or not self.gpu
        if name == "cuda":
            return True
        if name == "copy_":  # copy_(src): a copy between devices, never one within one
            return any(isinstance(a, torch.Tensor) and a.device != tensor.device for a in rest)
        targets = [a for a in (*rest, *kwargs.values()) if isinstance(a, (torch.device, str))]
        if not targets:
            return False  # .to(dtype)
        where = torch.device(targets[0])
        return where.type != tensor.device.type or not self.gpu

    @property
    def total(self) -> int:
        return sum(self.sites.values())


def _site() -> str:
    """The innermost frame in nmt/ (or scripts/) that made the call."""
    for frame in reversed(traceback.extract_stack()[:-2]):  # less _site, __torch_function__
        if "/nmt/" in frame.filename or "/scripts/" in frame.filename:
            return f"{Path(frame.filename).parent.name}/{Path(frame.filename).name}:{frame.lineno}"
    return "torch"


_SIGMOID_FORM_FROM = vml.SIGMOID_FORM_FROM  # nmt's own, for --paired tanh


# --paired's levers: name -> the model -> a function that turns the lever on or off. A script
# measuring a lever that is not in nmt adds its own before calling `main`
# (scripts/bench_fused_scorer.py).
class _Average:
    """The `smoothing` lever: the weights' running average (`train.exponential_smoothing`)
    folded in after each update, as training does, or not."""

    smoothed: Smoothed | None = None
    on = False

    @classmethod
    def switch(cls, model: torch.nn.Module) -> Callable[[bool], None]:
        cls.smoothed = Smoothed(model, 1e-4)  # type: ignore[arg-type]
        return lambda on: setattr(cls, "on", on)

    @classmethod
    def after_update(cls) -> None:
        if cls.on and cls.smoothed is not None:
            cls.smoothed.update(1_000)  # any step: one lerp of every weight


LEVERS: dict[str, Callable[[torch.nn.Module], Callable[[bool], None]]] = {
    "encoder": lambda model: lambda on: setattr(model.encoder, "fused", on),
    "decoder": lambda model: lambda on: setattr(model.decoder, "fused", on),
    "onednn": lambda model: lambda on: setattr(onednn, "enabled", on),
    # tanh as 2σ(2x) − 1 where nmt.vml takes it, or torch's tanh everywhere
    "tanh": lambda model: (
        lambda on: setattr(vml, "SIGMOID_FORM_FROM", _SIGMOID_FORM_FROM if on else sys.maxsize)
    ),
    "smoothing": _Average.switch,
}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--checkpoint", type=Path, help="a run's best.pt/last.pt, or its directory: that model"
    )
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--steps", type=whole(1), default=30, help="timed steps")
    ap.add_argument("--profile-steps", type=whole(0), default=3)
    ap.add_argument("--top", type=whole(1), default=15)
    ap.add_argument(
        "--step-by-step",
        action="store_true",
        help="decoder loop through autograd, a step at a time (the path before nmt.recurrence)",
    )
    ap.add_argument(
        "--encoder-gru",
        action="store_true",
        help="the encoder by nn.GRU over a packed sequence (the path before nmt.encoder_loop)",
    )
    mode = ap.add_mutually_exclusive_group()  # instead of the rate and the profile
    mode.add_argument(
        "--in-place",
        action="store_true",
        help="products timed in the step against alone, over the --profile-steps batches",
    )
    mode.add_argument(
        "--share",
        type=minutes,
        metavar="MINUTES",
        help="steps over the --steps batches for MINUTES, each followed by the limit's "
        "products: the share of the limit timed in the same seconds, a minute at a time",
    )
    mode.add_argument(
        "--count-syncs", action="store_true", help="count host syncs per update, by call site"
    )
    mode.add_argument(
        "--paired",
        choices=list(LEVERS),
        help="time each batch with a lever off and on (order alternating) instead: the "
        "encoder's or the decoder's hand-written loop, or float32 products through oneDNN "
        "(nmt.onednn), tanh's sigmoid form (nmt.vml), the weights' running average after "
        "each update (nmt.smoothing), or a lever a script adds "
        "(bench_fused_scorer.py); both rates and the median per-batch speed-up",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None, ready: Callable[[], None] | None = None) -> None:
    """`ready`, if given, runs once the model, data and batches are in hand, before the first
    step: a script compiles for a minute only after config, checkpoint and data are read."""
    args = arguments(argv)
    with tempfile.TemporaryDirectory(prefix="profile_step.") as tmp:  # data, where not nmt's
        _run(args, Path(tmp), ready)


def _run(args: argparse.Namespace, tmp: Path, ready: Callable[[], None] | None) -> None:
    cfg = load_config(args.config, overrides=args.set)
    device = resolve_device(cfg.train.device)
    precision = resolve_precision(args.precision, device)
    if (args.in_place or args.share) and device.type != "cpu":
        raise SystemExit(
            "--in-place and --share time products on the CPU (a GPU product returns at its launch)"
        )
    configure_device(device, cfg.train.threads)
    seed_everything(cfg.train.seed)
    ts, data = trained(cfg, args.config, args.checkpoint, device, precision, tmp)
    ts.model.decoder.fused = not args.step_by_step
    ts.model.encoder.fused = not args.encoder_gru
    train = data.train
    rows = epoch_rows(
        [len(s) for s in train.src_ids], [len(t) for t in train.tgt_ids], cfg.train, epoch=0
    )
    batches = [
        collate([train.src_ids[r] for r in b], [train.tgt_ids[r] for r in b], b).to(device)
        for b in rows[: 3 + args.steps + args.profile_steps]
    ]

    if ready is not None:
        ready()

    def step(batch) -> None:
        update(
            ts.model,
            [batch],
            optimizer=ts.optimizer,
            scaler=ts.scaler,
            device=device,
            precision=precision,
            label_smoothing=cfg.train.label_smoothing,
            clip_norm=cfg.train.clip_norm,
        )
        _Average.after_update()
        if device.type == "cuda":
            torch.cuda.synchronize()

    ts.model.train()
    if args.paired:  # warmed up both ways: a lever's compiling is not one of the timed steps
        switch = LEVERS[args.paired](ts.model)
        alternated(step, switch, batches[:3])
        switch(False)
    else:
        for b in batches[:3]:  # warm-up: allocator, oneDNN primitives
            step(b)
    if args.count_syncs:
        _count_syncs(step, batches[3:8], device, f"{args.config} {precision} on {device}")
        return
    if args.in_place:
        in_place(step, batches[3 + args.steps :], precision, args.top)
        return
    if args.share:
        same_moments(step, batches[3 : 3 + args.steps], cfg, precision, args.share)
        return
    if args.paired:
        _paired(step, args.paired, switch, batches[3 : 3 + args.steps], precision)
        return
    rates, tokens, seconds = [], 0, 0.0
    for b in batches[3 : 3 + args.steps]:
        start = time.perf_counter()
        step(b)
        took = time.perf_counter() - start
        rates.append(b.n_tgt_tokens / took)
        tokens, seconds = tokens + b.n_tgt_tokens, seconds + took
    print(
        f"{args.config} {precision}{' step by step' if args.step_by_step else ''}"
        f"{' nn.GRU encoder' if args.encoder_gru else ''}: "
        f"{statistics.median(rates):,.0f} target tokens/s "
        f"(median of {len(rates)} steps of {cfg.train.batch_size} sentences; "
        f"{tokens / seconds:,.0f} over all of them, as training's log windows count)"
    )

    if args.profile_steps:  # 0: the rate alone (alternated before/after comparisons)
        _profile(step, batches[3 + args.steps :], device, args.top)


def _count_syncs(step, batches: list, device: torch.device, label: str) -> None:
    """Host syncs an update over `batches` (`SyncCounter`), with where they are made."""
    counter = SyncCounter(device)
    with counter:
        for b in batches:
            step(b)
    n = len(batches)
    print(f"{label}: {counter.total / n:g} host syncs an update")
    for site, count in counter.sites.most_common():
        print(f"  {count / n:g}  {site}")


def alternated(
    run: Callable[[Any], object], switch: Callable[[bool], None], items: Sequence[Any]
) -> dict[bool, list[float]]:
    """Each item run twice, the lever off then on or on then off (alternating, so neither
    always runs first): the seconds of each run, by the lever's setting, in item order."""
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for i, item in enumerate(items):
        for on in (True, False) if i % 2 else (False, True):
            switch(on)
            start = time.perf_counter()
            run(item)
            seconds[on].append(time.perf_counter() - start)
    return seconds


def _paired(step, name: str, switch, batches: list, precision: str) -> None:
    """Each batch stepped twice (`alternated`): the rates over all batches and the median
    per-batch ratio, which the machine's drift over minutes does not move."""
    seconds = alternated(step, switch, batches)
    tokens = sum(b.n_tgt_tokens for b in batches)
    ratios = [off / on for off, on in zip(seconds[False], seconds[True], strict=True)]
    low, mid, high = statistics.quantiles(ratios, n=4)
    print(
        f"{precision}, {name} off: {tokens / sum(seconds[False]):,.0f}, "
        f"on: {tokens / sum(seconds[True]):,.0f} target tokens/s over {len(batches)} batches; "
        f"speed-up per batch: median {mid:.3f} (quartiles {low:.3f}-{high:.3f})"
    )


def _profile(step, batches: list, device: torch.device, top: int) -> None:
    """torch.profiler over `batches`: self CPU time by group of operators (GROUPS), then
    the `top` operators."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for b in batches:
            step(b)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    grouped: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        g = GROUPS.get(e.key, "everything else")
        grouped[g][0] += e.self_cpu_time_total
        grouped[g][1] += e.count
    n = len(batches)
    print(f"\nself CPU time over {n} steps ({total / 1e3 / n:.0f} ms a step):")
    print("| operators | ms a step | calls a step | share |\n|---|---|---|---|")
    for g, (us, count) in sorted(grouped.items(), key=lambda kv: -kv[1][0]):
        print(f"| {g} | {us / 1e3 / n:.0f} | {count / n:.0f} | {us / total:.0%} |")
    print()
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))


if __name__ == "__main__":
    with one_line():  # a config, checkpoint or data problem
        main()
