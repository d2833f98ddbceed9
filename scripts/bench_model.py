"""Training speed of the reference model, in target tokens per second, per decoder style.

Times forward + loss + backward + Adam step on random batches shaped like Multi30k
(64 sentences, source ≈14 and target ≈16 subwords, vocabulary 8,000) in fp32 and under
bf16 autocast (CPU) or fp16/bf16 autocast (CUDA). The model is the default ModelConfig
(emb 256, bi-GRU 256, GRU decoder 512, concat attention) with the decoder style changed.

    .venv/bin/python scripts/bench_model.py --steps 10

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
import torch.nn.functional as F

from nmt.config import ModelConfig
from nmt.model import Seq2Seq, build_model

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
            logits, _ = model(src, src_lens, tgt_in)
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID
            )
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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    half = [torch.bfloat16] if device.type == "cpu" else [torch.float16, torch.bfloat16]
    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for style, changes in STYLES.items():
        cfg = dataclasses.replace(ModelConfig(), **changes)  # type: ignore[arg-type]
        for dtype in [None, *half]:
            torch.manual_seed(0)
            model = build_model(
                cfg, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, shared_vocab=True
            ).to(device)
            model.train()
            tps = tokens_per_second(
                model, dtype=dtype, steps=args.steps, device=device, vocab=args.vocab
            )
            name = "fp32" if dtype is None else str(dtype).removeprefix("torch.")
            print(f"{style:14s} {name:9s} {tps:8.0f} target tokens/s")


if __name__ == "__main__":
    main()
