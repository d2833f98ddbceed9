"""A decoding step's GRU alone (one step of the reference decoder: input 768 = embedding 256 +
context 512, hidden 512) at a greedy step's and a beam-5 step's rows: float32 `nn.GRU` (what
float decoding runs), its dynamically quantized int8 form (what `--int8` runs: fbgemm), and on
a CPU with bf16 matrix units the same step by hand in bf16 with both weights laid out once for
oneDNN (`nmt.laid_out.LaidOutGRU`, what `--precision bf16` decoding runs there; the lead for AMX
in docs/benchmarks.md, session 24). Medians of `--calls` calls, `--repeats` times, and each
variant's largest difference from float32 on the new hidden state.

    .venv/bin/python scripts/bench_gru_step.py [--rows 64,320] [--input 768] [--hidden 512]

Only one benchmark at a time on a small machine: two at once make both figures wrong.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import bench_output_layer
import torch
from argtypes import whole, wholes
from torch import Tensor, nn

from nmt import laid_out, onednn
from nmt.runtime import cpu_has_bf16_matmul


def bf16_laid_out(gru: nn.GRU) -> Callable[[Tensor, Tensor], Tensor]:
    """x (rows, in), h (rows, H) float32 -> the GRU's new h (rows, H) float32: one step of
    `nmt.laid_out.LaidOutGRU`, what `--precision bf16` decoding runs (two bf16 products on
    weights laid out once, the gates in float32)."""
    step = laid_out.LaidOutGRU(gru)
    return lambda x, h: step(x.unsqueeze(1), h.unsqueeze(0))[1][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=wholes(1), default="64,320")
    ap.add_argument("--input", type=whole(1), default=768)
    ap.add_argument("--hidden", type=whole(1), default=512)
    ap.add_argument("--calls", type=whole(1), default=200)
    ap.add_argument("--repeats", type=whole(1), default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    gru = nn.GRU(args.input, args.hidden, batch_first=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_dynamic's deprecation notice
        from torch.ao.quantization import quantize_dynamic

        q8 = quantize_dynamic(nn.Sequential(gru), {nn.GRU}, inplace=False)[0]
    bf16 = onednn.available and cpu_has_bf16_matmul()
    print(f"{torch.get_num_threads()} threads, GRU {args.input} -> {args.hidden}, one step")
    with torch.inference_mode():
        for m in args.rows:
            x, h = torch.randn(m, 1, args.input), torch.randn(1, m, args.hidden)
            variants = {
                "float32 nn.GRU": lambda x=x, h=h: gru(x, h)[1][0],
                "int8 nn.GRU": lambda x=x, h=h: q8(x, h)[1][0],
            }
            if bf16:
                step = bf16_laid_out(gru)
                variants["bf16 laid out"] = lambda x=x, h=h, step=step: step(x[:, 0], h[0])
            want = variants["float32 nn.GRU"]()
            for name, f in variants.items():
                err = (f() - want).abs().max().item()
                times = [bench_output_layer.median_us(f, args.calls) for _ in range(args.repeats)]
                shown = ", ".join(f"{t:,.0f}" for t in times)
                print(f"{m} rows: {name}: {shown} us; largest difference from float32 {err:.2g}")


if __name__ == "__main__":
    main()
