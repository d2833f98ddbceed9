"""Training speed of the reference model, in target tokens per second, per decoder style.

Times forward + loss + backward + Adam step on random batches shaped like Multi30k
(64 sentences, source ≈14 and target ≈16 subwords, vocabulary 8,000) in fp32 and under
bf16 autocast (CPU) or fp16/bf16 autocast (CUDA). The model is the default ModelConfig
(emb 256, bi-GRU 256, GRU decoder 512, concat attention) with the decoder style changed.

    .venv/bin/python scripts/bench_model.py --steps 10
    .venv/bin/python scripts/bench_model.py --styles luong --dtypes fp32 --copy  # copy off/on
    .venv/bin/python scripts/bench_model.py --dtypes fp32 --family  # local and multi-head

The loss is the training loss (`nmt.step.token_loss`, label smoothing 0.1): with `--copy`,
each setting is timed without and with copy attention, alternately `--repeats` times, and
the ratio of the medians printed. With `--family`, each setting is timed with global
attention and each of `FAMILY` (local-m, local-p, 4 heads), alternately, and each one's
ratio to global printed: what a variant costs where it leaves the fused training loop.

On CPU, glibc gives each (B*T, V) float32 buffer over 32 MB (64 x 16 x 8000 logits) back to
the OS and page-faults it in again at every step; raising its mmap threshold avoids that:

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184 \
        .venv/bin/python scripts/bench_model.py
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time

import torch
from argtypes import some_of, whole

from nmt.config import ModelConfig
from nmt.model import Seq2Seq, build_model
from nmt.step import token_loss

PAD_ID, BOS_ID, EOS_ID = 0, 2, 3  # nmt.tokenizer's fixed ids
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # --dtypes
STYLES = {
    "bahdanau": {"decoder": "bahdanau"},
    "luong": {"decoder": "luong", "input_feeding": False},
    "luong+feeding": {"decoder": "luong", "input_feeding": True},
}
FAMILY = {
    "global": {},
    "local_m": {"attention_scope": "local_m"},
    "local_p": {"attention_scope": "local_p"},
    "heads4": {"attention_heads": 4},
}


def random_batch(
    batch: int, src_len: int, tgt_len: int, vocab: int, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded src (B, S) ending in EOS, CPU lengths (B,), tgt_in (B, T) and tgt_out (B, T)."""
    src_lens = torch.randint(src_len // 2, src_len + 1, (batch,), generator=gen)
    tgt_lens = torch.randint(tgt_len // 2, tgt_len + 1, (batch,), generator=gen)
    src = torch.randint(4, vocab, (batch, src_len), generator=gen)
    tgt = torch.randint(4, vocab, (batch, tgt_len + 1), generator=gen)
    src[torch.arange(src_len) >= src_lens[:, None]] = PAD_ID
    src[torch.arange(batch), src_lens - 1] = EOS_ID
    tgt[:, 0] = BOS_ID
    tgt[torch.arange(tgt_len + 1) > tgt_lens[:, None]] = PAD_ID
    tgt[torch.arange(batch), tgt_lens] = EOS_ID
    return src.to(device), src_lens, tgt[:, :-1].to(device), tgt[:, 1:].to(device)


def tokens_per_second(
    model: Seq2Seq, *, dtype: torch.dtype | None, steps: int, device: torch.device, vocab: int
) -> float:
    """Real (non-pad) target tokens per second: mean tokens per step / median step time.

    The median keeps the figure steady on a machine shared with other jobs.
    """
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # CPU fused since torch 2.4
    gen = torch.Generator().manual_seed(0)
    batches = [random_batch(64, 14, 16, vocab, device, gen) for _ in range(steps + 2)]
    tokens, times = [], []
    for i, (src, src_lens, tgt_in, tgt_out) in enumerate(batches):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with autocast:
            loss = token_loss(model(src, src_lens, tgt_in), tgt_out, 0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps (allocator, autocast weight casts, thread pools)
            times.append(time.perf_counter() - start)
            tokens.append(int((tgt_out != PAD_ID).sum()))
    return statistics.mean(tokens) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=whole(1), default=10, help="timed steps per setting")
    parser.add_argument("--threads", type=whole(1), default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=whole(5), default=8000)
    parser.add_argument(
        "--styles", type=some_of(STYLES), default=",".join(STYLES), help="decoder styles to time"
    )
    parser.add_argument(
        "--dtypes", type=some_of(DTYPES), default=None, help="e.g. fp32,bf16; default all here"
    )
    parser.add_argument("--copy", action="store_true", help="time copy attention off and on")
    parser.add_argument("--family", action="store_true", help="time local and multi-head too")
    parser.add_argument(
        "--repeats", type=whole(1), default=3, help="alternations with --copy/--family"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    default = ["fp32", "bf16"] + ([] if device.type == "cpu" else ["fp16"])
    names, styles = args.dtypes or default, args.styles
    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for style in styles:
        for name in names:
            _time_setting(args, device, style, name, DTYPES[name])


def _time_setting(
    args: argparse.Namespace, device: torch.device, style: str, name: str, dtype: torch.dtype | None
) -> None:
    """One decoder style in one precision: its tokens/s, and with --copy / --family the
    variants' too, timed alternately, as ratios of the medians."""
    variants: dict[str, dict] = {"": {}}
    if args.copy:
        variants = {"": {}, "copy": {"copy": True}}
    elif args.family:
        variants = dict(FAMILY)
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats if len(variants) > 1 else 1):
        for variant, keys in variants.items():
            cfg = dataclasses.replace(ModelConfig(), **STYLES[style], **keys)
            torch.manual_seed(0)
            model = build_model(
                cfg, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, shared_vocab=True
            ).to(device)
            model.train()
            rate = tokens_per_second(
                model, dtype=dtype, steps=args.steps, device=device, vocab=args.vocab
            )
            rates[variant].append(rate)
    first, *others = variants
    base = statistics.median(rates[first])
    line = f"{style:14s} {name:9s} {first or 'as is':8s} {base:8.0f} target tokens/s"
    for variant in others:
        rate = statistics.median(rates[variant])
        line += f"; {variant} {rate:8.0f} ({rate / base:.3f}x)"
    print(line)


if __name__ == "__main__":
    main()
