"""Time greedy and beam search on 1,000 random sources with a reference-size random model.

The model is the reference architecture (embeddings 256, bi-GRU 256, decoder 512, concat
attention, vocabulary 8,000) with random weights: decoding speed does not depend on what
the weights are, only on how many steps are taken. A random model rarely emits EOS, so every
sentence would run to the length limit (2 x source + 10: about three times a trained model's
output). `--out-ratio` (default 1.1, French is ~10% longer than English) caps each output at
that multiple of its source length instead, so the timing matches a trained model's work;
`--out-ratio 0` keeps the decode config's limits (the worst case).

Example: .venv/bin/python scripts/bench_decode.py --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from argtypes import above_zero, whole

from nmt.batching import collate
from nmt.config import config_from_dict
from nmt.model import build_model
from nmt.runtime import autocast
from nmt.search import decode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=whole(1), default=1000)
    p.add_argument("--min-len", type=whole(1), default=5, help="shortest source, in subword tokens")
    p.add_argument("--max-len", type=whole(1), default=30, help="longest source, in subword tokens")
    p.add_argument("--beam", type=whole(1), default=5)
    p.add_argument("--batch-size", type=whole(1), default=None, help="default: decode.batch_size")
    p.add_argument("--out-ratio", type=above_zero("times the source length"), default=1.1)
    p.add_argument("--threads", type=whole(1), default=None)
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: autocast, about twice as fast on CPUs with bf16 matrix units "
        "(Translator decodes in fp32)",
    )
    p.add_argument("--seed", type=whole(0), default=1)
    args = p.parse_args()
    if args.max_len < args.min_len:
        p.error(f"--max-len {args.max_len}: below --min-len {args.min_len}")
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = config_from_dict({})  # the defaults are the reference model and decode settings
    dc = cfg.decode
    batch_size = args.batch_size or dc.batch_size
    torch.manual_seed(args.seed)
    vocab = cfg.tokenizer.vocab_size
    model = build_model(cfg.model, src_vocab_size=vocab, tgt_vocab_size=vocab, shared_vocab=True)
    model.eval()
    params = sum(p.numel() for p in model.parameters())

    g = torch.Generator().manual_seed(args.seed)
    lens = torch.randint(args.min_len, args.max_len + 1, (args.sentences,), generator=g).tolist()
    rows = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lens]
    # Sorted by length into batches, as Translator does.
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]), reverse=True)
    batches = [
        collate([rows[i] for i in order[k : k + batch_size]], None, order[k : k + batch_size])
        for k in range(0, len(order), batch_size)
    ]
    ratio, const = (args.out_ratio, 0) if args.out_ratio > 0 else (dc.max_len_ratio, 0)
    if args.out_ratio <= 0:
        const = dc.max_len_const
    print(
        f"model: {params / 1e6:.1f}M parameters; {args.sentences} sources of "
        f"{args.min_len}-{args.max_len} tokens (mean {sum(lens) / len(lens):.1f}); "
        f"batches of {batch_size}; output limit {ratio:g} x source + {const}; "
        f"{torch.get_num_threads()} threads; {args.precision}"
    )

    def run(name: str, search) -> None:
        start = time.perf_counter()
        tokens = 0
        for b in batches:
            with autocast(torch.device("cpu"), args.precision):
                result = search(b)
            tokens += sum(len(h.tokens) for h in result.best)
        seconds = time.perf_counter() - start
        print(
            f"{name}: {seconds:.2f} s, {args.sentences / seconds:.0f} sentences/s, "
            f"{tokens / seconds:.0f} output tokens/s"
        )

    settings = dataclasses.replace(dc, max_len_ratio=ratio, max_len_const=const, min_len=0)
    run("greedy", lambda b: decode(model, b.src, b.src_lens, settings, beam=1))
    run(f"beam {args.beam}", lambda b: decode(model, b.src, b.src_lens, settings, beam=args.beam))


if __name__ == "__main__":
    main()
