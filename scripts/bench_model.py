"""Training speed of the reference model, in target tokens per second, per decoder style.

Times forward + loss + backward + Adam step on random batches shaped like Multi30k
(64 sentences, source ≈14 and target ≈16 subwords, vocabulary 8,000) in fp32 and under
bf16 autocast (CPU) or fp16/bf16 autocast (CUDA). The model is the default ModelConfig
(emb 256, bi-GRU 256, GRU decoder 512, concat attention) with the decoder style changed.

    .venv/bin/python scripts/bench_model.py --steps 10
    .venv/bin/python scripts/bench_model.py --styles luong --dtypes fp32 --copy  # copy off/on

The loss is the training loss (`nmt.step.token_loss`, label smoothing 0.1): with `--copy`,
each setting is timed without and with copy attention, alternately `--repeats` times, and
the ratio of the medians printed.

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

from nmt.config import ModelConfig
from nmt.model import Seq2Seq, build_model
from nmt.step import token_loss

PAD_ID, BOS_ID, EOS_ID = 0, 2, 3  # nmt.tokenizer's fixed ids
STYLES = {
    "bahdanau": {"decoder": "bahdanau"},
    "luong": {"decoder": "luong", "input_feeding": False},
    "luong+feeding": {"decoder": "luong", "input_feeding": True},
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
    parser.add_argument("--steps", type=int, default=10, help="timed steps per setting")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--styles", default=",".join(STYLES), help="decoder styles to time")
    parser.add_argument("--dtypes", default=None, help="e.g. fp32,bf16; default all here")
    parser.add_argument("--copy", action="store_true", help="time copy attention off and on")
    parser.add_argument("--repeats", type=int, default=3, help="alternations with --copy")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    default = ["fp32", "bf16"] + ([] if device.type == "cpu" else ["fp16"])
    names = args.dtypes.split(",") if args.dtypes else default
    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for style in args.styles.split(","):
        for name in names:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.repeats if args.copy else 1):
                for copy in (False, True) if args.copy else (False,):
                    cfg = dataclasses.replace(ModelConfig(), **STYLES[style], copy=copy)  # type: ignore[arg-type]
                    torch.manual_seed(0)
                    model = build_model(
                        cfg, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, shared_vocab=True
                    ).to(device)
                    model.train()
                    rates[copy].append(
                        tokens_per_second(
                            model,
                            dtype=dtypes[name],
                            steps=args.steps,
                            device=device,
                            vocab=args.vocab,
                        )
                    )
            off = statistics.median(rates[False])
            line = f"{style:14s} {name:9s} {off:8.0f} target tokens/s"
            if args.copy:
                on = statistics.median(rates[True])
                line += f"; copy {on:8.0f} ({on / off:.3f}x)"
            print(line)


if __name__ == "__main__":
    main()
