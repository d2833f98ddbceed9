"""A training step's matrix products against the same products timed alone, the way
`scripts/peers/limit.py` times the machine's limit: `profile_step.py --in-place` and
`--share` (CPU only: a GPU product returns at its launch).

`in_place`: each product timed where the step runs it against alone, over a few steps: how
much of the distance to the limit is products running below their own rate.

`same_moments` (`--share`): each step followed at once by the limit's own products (those of
compare_peers' reference batch, on the library that ran each faster): the step's share of
the limit with both timed in the same seconds, a minute at a time. On a shared machine the
products slow down in a slow spell as much as the step does (session 46), while
compare_peers' limit keeps each product's fastest timing over passes minutes apart, so its
share moves with the spells. Each minute's row gives the share against the limit of the
products' typical timing in that minute, and against their fastest timing in it.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from peers.limit import (
    Product,
    libraries,
    median_seconds,
    operands,
    product_of,
    step_products,
    time_product,
)
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.config import Config
from nmt.runtime import DTYPES


class _ProductTimer(TorchDispatchMode):
    """Seconds each matrix product takes where a step runs it, by shape: perf_counter around
    the call (on a CPU a product returns when it is done)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: defaultdict[Product, float] = defaultdict(float)
        self.calls: Counter[Product] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        product = product_of(func, args)
        if product is None:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds[product] += time.perf_counter() - start
        self.calls[product] += 1
        return out


def in_place(step, batches: list, precision: str, top: int) -> None:
    """The step over `batches` without and then with `_ProductTimer`; each product's time in
    place against its time alone (`limit.time_product`, the limit's own timing)."""
    if not batches:
        raise SystemExit("--in-place: no batches left after the warm-up and --steps; take fewer")
    plain = 0.0
    for b in batches:
        start = time.perf_counter()
        step(b)
        plain += time.perf_counter() - start
    timer = _ProductTimer()
    with timer:
        for b in batches:
            step(b)
    n, cpu = len(batches), torch.device("cpu")
    alone = {p: time_product(p, DTYPES[precision], cpu)[0] * c for p, c in timer.calls.items()}
    placed = sum(timer.seconds.values())
    print(
        f"{precision}, {n} step{'s' * (n != 1)}, {plain / n * 1e3:.1f} ms a step: matrix products "
        f"{placed / n * 1e3:.1f} ms in place ({placed / plain:.0%} of the step), "
        f"{sum(alone.values()) / n * 1e3:.1f} ms alone; everything else "
        f"{(plain - placed) / n * 1e3:.1f} ms"
    )
    print("| product (b × m × k × n) | calls a step | ms in place | ms alone | GFLOP/s in place |")
    print("|---|---|---|---|---|")
    for p in sorted(timer.calls, key=lambda p: -timer.seconds[p])[:top]:
        calls, seconds = timer.calls[p], timer.seconds[p]
        print(
            f"| {p.op} {p.b} × {p.m} × {p.k} × {p.n} | {calls / n:.1f} | {seconds / n * 1e3:.2f} "
            f"| {alone[p] / n * 1e3:.2f} | {p.flops * calls / seconds / 1e9:.0f} |"
        )


@dataclass
class _Window:
    """A minute of `same_moments` (or all of them): the steps' target tokens and seconds, and
    each product's timings after each step."""

    tokens: int = 0
    step_s: float = 0.0
    rounds: list[dict[Product, float]] = field(default_factory=list)

    def rates(self, seen: Counter[Product], tokens: int) -> tuple[float, float, float]:
        """Target tokens/s of the steps; of the limit's products over the same seconds (a
        step's worth, counts included, each round as timed); and of the same products at
        their fastest timing in these seconds (as compare_peers merges its passes)."""
        typical = sum(seen[p] * t for r in self.rounds for p, t in r.items()) / len(self.rounds)
        fastest = sum(n * min(r[p] for r in self.rounds) for p, n in seen.items())
        return self.tokens / self.step_s, tokens / typical, tokens / fastest

    def joined(self, other: _Window) -> _Window:
        return _Window(
            self.tokens + other.tokens, self.step_s + other.step_s, self.rounds + other.rounds
        )


def _moment_timer(
    cfg: Config, precision: str
) -> tuple[Callable[[], dict[Product, float]], Counter[Product], int]:
    """A function that times each of the limit's products once more, on the library that ran
    it faster alone (`median_seconds` without its 0.15 s budget: the limit's own warm-ups and
    timings, no more). With it, the products' counts in a step and the reference batch's
    target tokens."""
    seen, tokens = step_products(cfg, vocab=cfg.tokenizer.vocab_size, src_len=16, tgt_len=16)
    dtype, cpu = DTYPES[precision], torch.device("cpu")
    runs = {}
    for p in seen:
        a, b = operands(p, dtype, cpu)
        library = time_product(p, dtype, cpu)[1]
        run = dict(libraries(p, a, b))[library]
        runs[p] = (run, a, b)

    def timed() -> dict[Product, float]:
        return {p: median_seconds(run, a, b, budget=0) for p, (run, a, b) in runs.items()}

    return timed, seen, tokens


def same_moments(step, batches: list, cfg: Config, precision: str, minutes: float) -> None:
    """Steps over `batches` (again and again) for `minutes`, each followed by the limit's
    products timed once more (`_moment_timer`); per minute and over all, the step's rate
    against the limit timed in the same seconds, typical and fastest timings."""
    timed, seen, tokens = _moment_timer(cfg, precision)
    windows: defaultdict[int, _Window] = defaultdict(_Window)
    start, i = time.perf_counter(), 0
    while not windows or time.perf_counter() - start < minutes * 60:
        window = windows[int((time.perf_counter() - start) // 60)]
        b = batches[i % len(batches)]
        i += 1
        began = time.perf_counter()
        step(b)
        window.step_s += time.perf_counter() - began
        window.tokens += b.n_tgt_tokens
        window.rounds.append(timed())
    print(f"{precision}: each step followed by the limit's products, tokens/s and shares")
    print("| minute | steps | the step | limit, typical timing | share | limit, fastest | share |")
    print("|---|---|---|---|---|---|---|")
    for minute, w in sorted(windows.items()):
        rate, typical, fastest = w.rates(seen, tokens)
        print(
            f"| {minute + 1} | {len(w.rounds)} | {rate:,.0f} | {typical:,.0f} | "
            f"{rate / typical:.1%} | {fastest:,.0f} | {rate / fastest:.1%} |"
        )
    every = functools.reduce(_Window.joined, windows.values())
    rate, typical, fastest = every.rates(seen, tokens)
    print(
        f"over all {i} step{'s' * (i != 1)}: {rate:,.0f} target tokens/s; "
        f"{rate / typical:.1%} of the limit at the same seconds' typical timings "
        f"({typical:,.0f}); {rate / fastest:.1%} of the limit "
        f"of each product's fastest timing in the run ({fastest:,.0f}), as compare_peers counts"
    )
