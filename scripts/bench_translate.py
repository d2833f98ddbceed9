"""Decoding levers side by side on a trained model: each variant translates the same file in
the same process, in turn, `--repeats` times (this machine's speed drifts by ±15 % within
minutes, so only alternation inside one run compares), greedy and with beam 5.

Variants:
- `as-is`: `Translator` as `nmt translate` runs it (shortlist, the attention's float32
  sigmoid route);
- `tanh`: every float32 tanh as torch's own (MKL's), as where MKL runs its fast path
  (`nmt.vml.TANH_FAST`): the additive (concat) scorer's hidden layer as tanh(q + k), as
  before session 14 (`nmt.attention.additive_hidden`), and the GRU step's and the outputs';
- `torch-tanh`: the GRU step's and the outputs' tanh as torch's own, as before session 42
  (`nmt.vml.tanh`); the scorer keeps its sigmoid route;
- `full-vocab`: no shortlist (`nmt translate --full-vocab`);
- `unrounded`: the shortlist's columns as listed, not rounded up to a multiple of
  `nmt.shortlist.COLUMN_MULTIPLE` (as before session 15);
- `bf16`: the model under bf16 autocast (`nmt translate --precision bf16`; CPUs with bf16
  matrix units);
- `int8`: int8 weights (`nmt translate --int8`, `nmt.int8`);
- `int8+bf16`: both;
- `int8+torch-tanh`: int8 weights, `torch-tanh`.

Prints each variant's fastest time of its repeats (and all of them), BLEU against --ref if
given, and whether its output equals the first variant's.

Example:
    .venv/bin/python scripts/bench_translate.py runs/ref_linear/last.pt \\
        --src ../shared/data/multi30k/test_2016_flickr.en --variants as-is,tanh
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from argtypes import sentence_lines, some_of, whole, wholes

import nmt.attention
import nmt.shortlist
import nmt.vml
from nmt import evaluate
from nmt.ensemble import Ensemble
from nmt.errors import NmtError, one_line
from nmt.files import read_lines
from nmt.model import Seq2Seq
from nmt.translate import Translator

VARIANTS = (
    "as-is",
    "tanh",
    "full-vocab",
    "unrounded",
    "bf16",
    "int8",
    "int8+bf16",
    "torch-tanh",
    "int8+torch-tanh",
)
# variants that are a Translator loaded another way: its from_checkpoint arguments
LOADED: dict[str, dict[str, Any]] = {
    "bf16": {"precision": "bf16"},
    "int8": {"int8": True},
    "int8+bf16": {"int8": True, "precision": "bf16"},
    "int8+torch-tanh": {"int8": True},
}


@contextlib.contextmanager
def variant(name: str, tr: Translator) -> Iterator[None]:
    """`tr` as the variant `name` decodes, put back afterwards."""
    members = tr.model.models if isinstance(tr.model, Ensemble) else [tr.model]
    models = [m for m in members if isinstance(m, Seq2Seq)]
    tanh_fast, shortlists = nmt.vml.TANH_FAST, [m.shortlist for m in models]
    form_from = nmt.vml.SIGMOID_FORM_FROM
    if name.endswith("torch-tanh"):
        nmt.vml.SIGMOID_FORM_FROM = sys.maxsize
    multiple = nmt.shortlist.COLUMN_MULTIPLE
    if name == "tanh":  # torch's tanh everywhere, as decoding takes it where it is fast
        nmt.vml.TANH_FAST = True
    if name == "unrounded":
        nmt.shortlist.COLUMN_MULTIPLE = 1
    if name == "full-vocab":
        for m in models:
            m.shortlist = None
    try:
        yield
    finally:
        nmt.vml.TANH_FAST = tanh_fast
        nmt.vml.SIGMOID_FORM_FROM = form_from
        nmt.shortlist.COLUMN_MULTIPLE = multiple
        for m, s in zip(models, shortlists, strict=True):
            m.shortlist = s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model", help="run directory or checkpoint")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--ref", type=Path, help="references: BLEU beside each time")
    p.add_argument(
        "--variants",
        type=some_of(VARIANTS),
        default="as-is,tanh",
        help=f"comma-separated, of {','.join(VARIANTS)}",
    )
    p.add_argument("--beams", type=wholes(1), default="1,5", help="comma-separated beam sizes")
    p.add_argument("--repeats", type=whole(1), default=3)
    p.add_argument("--batch-size", type=whole(1), default=64)
    args = p.parse_args()
    names = args.variants
    with one_line():
        lines = sentence_lines(args.src, "--src")  # the inputs first, before any loading
        refs = read_lines(args.ref) if args.ref else None
        if refs is not None and len(refs) != len(lines):
            raise NmtError(f"--ref {args.ref}: {len(refs)} lines; --src has {len(lines)}")
        _compare(args, names, lines, refs)


def _compare(
    args: argparse.Namespace, names: list[str], lines: list[str], refs: list[str] | None
) -> None:
    """Every variant in turn, `args.repeats` times, each beam size: times, BLEU, sameness."""
    tr = Translator.from_checkpoint(args.model, "cpu")
    loaded = {
        n: Translator.from_checkpoint(args.model, "cpu", **LOADED[n]) for n in names if n in LOADED
    }
    print(
        f"{args.model}: {len(lines)} sentences, {torch.get_num_threads()} threads, fp32 "
        "unless the variant says otherwise"
    )
    for t in [tr, *loaded.values()]:  # warm-up
        t.translate(lines[: args.batch_size], beam=5, batch_size=args.batch_size)
    for beam in args.beams:
        times: dict[str, list[float]] = {n: [] for n in names}
        outputs: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for name in names:
                with variant(name, tr):
                    t = loaded.get(name, tr)
                    seconds, outputs[name] = _timed(t, lines, beam, args.batch_size)
                times[name].append(seconds)
        for name in names:
            bleu = f", BLEU {evaluate.bleu(outputs[name], refs).score:.2f}" if refs else ""
            same = "same output" if outputs[name] == outputs[names[0]] else "output differs"
            runs = ", ".join(f"{t:.2f}" for t in times[name])
            print(
                f"beam {beam} {name}: {min(times[name]):.2f} s (runs {runs}){bleu}; {same}; "
                f"{min(times[names[0]]) / min(times[name]):.2f}x the first"
            )


def _timed(tr: Translator, lines: list[str], beam: int, batch: int) -> tuple[float, list[str]]:
    start = time.perf_counter()
    hyps = tr.translate(lines, beam=beam, batch_size=batch)
    return time.perf_counter() - start, [h.text for h in hyps]


if __name__ == "__main__":
    main()
