"""The training loss alone, forward and backward: PyTorch's cross entropy with label smoothing
against nmt's fused one (`nmt.loss`), on (N, V) float32 logits, alternating, median times.

    .venv/bin/python scripts/bench_loss.py [--rows 1024] [--vocab 8000] [--smoothing 0.1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from nmt.loss import cross_entropy
from nmt.tokenizer import PAD_ID


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1024, help="target tokens of a batch")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--smoothing", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.rows, args.vocab, requires_grad=True)
    t = torch.randint(4, args.vocab, (args.rows,))
    eps = args.smoothing

    def torchs() -> None:
        F.cross_entropy(x, t, ignore_index=PAD_ID, label_smoothing=eps, reduction="sum").backward()

    def fused() -> None:
        cross_entropy(x, t, eps).backward()

    times: dict[str, list[float]] = {"torch": [], "fused": []}
    for _ in range(args.repeats):
        for name, f in (("torch", torchs), ("fused", fused)):
            for _ in range(3):
                f()
            for _ in range(20):
                start = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - start)
    a, b = (statistics.median(times[k]) * 1000 for k in ("torch", "fused"))
    print(
        f"({args.rows}, {args.vocab}) fp32, smoothing {eps}, {torch.get_num_threads()} threads: "
        f"F.cross_entropy {a:.1f} ms, nmt.loss.cross_entropy {b:.1f} ms ({a / b:.2f}x)"
    )


if __name__ == "__main__":
    main()
