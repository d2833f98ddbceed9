"""The training losses alone, forward and backward, on (N, V) logits: the plain model's
(`nmt.loss.cross_entropy`) and the copy model's (`nmt.copy.copy_loss`, 20 source
pieces a sentence), each with glibc's malloc as it comes (every block above 32 MiB a fresh
mmap) and with freed memory kept for reuse (`nmt.runtime.keep_freed_memory`, what nmt runs
with); alternating, median times.

    .venv/bin/python scripts/bench_loss.py [--rows 1280] [--vocab 8000] [--dtype bf16]

Only one benchmark at a time on a small machine: two at once make both figures wrong.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from argtypes import whole

from nmt.copy import copy_loss
from nmt.loss import cross_entropy
from nmt.runtime import keep_freed_memory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=whole(64), default=1280, help="target tokens of a batch")
    ap.add_argument("--vocab", type=whole(2), default=8000)
    ap.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="the logits' dtype")
    ap.add_argument("--smoothing", type=float, default=0.1)
    ap.add_argument("--repeats", type=whole(1), default=3)
    args = ap.parse_args()
    if not 0 <= args.smoothing < 1:  # as train.label_smoothing
        ap.error(f"--smoothing {args.smoothing}: expected a number in [0, 1)")
    torch.manual_seed(0)
    B, S, eps = 64, 20, args.smoothing
    T = args.rows // B
    x = torch.randn(B, T, args.vocab, dtype=DTYPES[args.dtype], requires_grad=True)
    t = torch.randint(4, args.vocab, (B, T))
    gate = torch.randn(B, T, requires_grad=True)
    attention = torch.softmax(torch.randn(B, T, S), -1).requires_grad_()
    src = torch.randint(4, args.vocab, (B, S))

    def plain() -> None:
        cross_entropy(x.flatten(0, 1), t.flatten(), eps).backward()

    def copy() -> None:
        copy_loss(x, gate, attention, src, t, eps).backward()

    losses: dict[str, Callable[[], None]] = {"plain (cross_entropy)": plain, "copy_loss": copy}
    times = _alternate(losses, args.repeats)
    print(
        f"({args.rows}, {args.vocab}) {args.dtype}, smoothing {eps}, "
        f"{torch.get_num_threads()} threads, median ms forward + backward:"
    )
    print("| | malloc as it comes | freed memory kept | |\n|---|---|---|---|")
    for name in losses:
        fresh, kept = (statistics.median(times[name, m]) * 1000 for m in (False, True))
        print(f"| {name} | {fresh:.1f} | {kept:.1f} | {fresh / kept:.2f}x |")


def _alternate(losses: dict[str, Callable[[], None]], repeats: int) -> dict:
    """Times of 20 calls of each loss under each malloc setting, `repeats` rounds."""
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(repeats):
        for keep in (False, True):
            if not keep_freed_memory(keep):
                raise SystemExit("bench_loss.py: needs glibc's malloc (Linux)")
            for name, f in losses.items():
                for _ in range(3):
                    f()
                for _ in range(20):
                    start = time.perf_counter()
                    f()
                    times.setdefault((name, keep), []).append(time.perf_counter() - start)
    return times


if __name__ == "__main__":
    main()
