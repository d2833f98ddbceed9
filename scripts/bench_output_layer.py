"""The decoding output layer alone: a batch's shortlisted (L, E) weight times a step's rows,
in float32 (`nmt.onednn.linear_layer`, what float decoding runs) and as int8 rows
(`nmt.int8.linear`, what `--int8` runs, the input's quantization included), in turn, median of
`--calls` calls, `--repeats` times; on a CPU with bf16 matrix units also in bf16 with the
weight laid out once for oneDNN (`bf16_laid_out`: what `--precision bf16` decoding runs there
since session 25, `nmt.laid_out`; the layout's own time is printed once).

    .venv/bin/python scripts/bench_output_layer.py [--rows 64,320] [--columns 3456] [--size 512]

64 rows are a greedy step of 64 sentences, 320 a beam-5 step; 3,456 columns the median
shortlist of a Multi30k validation batch. Only one benchmark at a time on a small machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from argtypes import whole, wholes
from torch import Tensor

from nmt import int8, laid_out, onednn
from nmt.runtime import cpu_has_bf16_matmul


def median_us(f: Callable[[], object], calls: int) -> float:
    for _ in range(5):  # warm: oneDNN makes a kernel for each new shape
        f()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def bf16_laid_out(weight: Tensor, bias: Tensor) -> Callable[[Tensor], Tensor]:
    """x (rows, E) float32 -> x Wᵀ + b (rows, L) float32 in bf16, W laid out once for oneDNN's
    kernels (AMX tiles where the CPU has them) as `--precision bf16` decoding lays it out
    (`nmt.laid_out`, its buckets included)."""
    laid = laid_out.LaidOut.of(weight, bias)
    return lambda x: laid_out.linear(x, laid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=wholes(1), default="64,320")
    ap.add_argument("--columns", type=whole(1), default=3456)
    ap.add_argument("--size", type=whole(int8.MIN_INNER), default=512)
    ap.add_argument("--calls", type=whole(1), default=50)
    ap.add_argument("--repeats", type=whole(1), default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    weight = torch.randn(args.columns, args.size) * 0.05  # (L, E)
    bias = torch.randn(args.columns) * 0.1  # (L,)
    rows8 = int8.Int8Rows.of(weight)
    print(f"{torch.get_num_threads()} threads, (rows, {args.size}) x ({args.size}, {args.columns})")
    with torch.inference_mode():
        for m in args.rows:
            x = torch.randn(m, args.size)
            bf16 = None
            if onednn.available and cpu_has_bf16_matmul():
                layout = median_us(lambda: bf16_laid_out(weight, bias), 1)
                bf16 = bf16_laid_out(weight, bias)
                print(f"{m} rows: laying the bf16 weight out: {layout:,.0f} us")
            for _ in range(args.repeats):
                f32 = median_us(lambda x=x: onednn.linear_layer(x, weight, bias), args.calls)
                i8 = median_us(lambda x=x: int8.linear(x, rows8, bias), args.calls)
                line = f"{m} rows: float32 {f32:,.0f} us, int8 rows {i8:,.0f} us, {f32 / i8:.2f}x"
                if bf16 is not None:
                    b16 = median_us(lambda x=x, f=bf16: f(x), args.calls)
                    line += f"; bf16 laid out {b16:,.0f} us, {i8 / b16:.2f}x int8's speed"
                print(line)


if __name__ == "__main__":
    main()
