"""What a decoding step costs against its rows, and how many rows a search's steps carry.

A search step's time is about a fixed part (the weights read once a step, and the step's
operators' own cost) plus a part for each row it decodes. This script times a trained
model's `step` at several row counts, on real sentences of a source file (one batch of
them, encoded once), and fits `fixed + per_row × rows` to the medians; then it counts the
rows of every step of a real search over the file (`--rows-of-search`): how many steps ran,
how many rows they carried, and how many ran nearly empty at the ends of batches. Together
they say what keeping every step full (refilling finished rows from the next batch) could
save: the fixed part of the steps it would not run.

    .venv/bin/python scripts/bench_step.py CHECKPOINT \
        --src ../shared/data/multi30k/test_2016_flickr.en [--int8 | --precision bf16] \
        [--beam 1] [--rows 64,48,32,16,8,1] [--threads 1] [--rows-of-search]

Medians of `--calls` calls. Only one benchmark at a time on a small machine: two at once
make both figures wrong.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

import bench_output_layer
import torch
from argtypes import decoding_options, whole, wholes

from nmt.batching import collate
from nmt.errors import one_line
from nmt.files import read_lines
from nmt.tokenizer import BOS_ID
from nmt.translate import Translator


def step_us(tr: Translator, ids: list[list[int]], rows: int, beam: int, calls: int) -> float:
    """The median time in µs of the model's `step` for the first `rows` sentences of `ids`
    (sorted longest first, as a batch is), each as `beam` hypotheses, from BOS."""
    check_rows(rows, len(ids))
    model = tr.model
    batch = collate(ids[:rows], None, range(rows)).to(tr.device)
    with torch.inference_mode():
        enc = model.encode(batch.src, batch.src_lens)
        state = model.init_state(enc)
        if beam > 1:
            enc = enc.beams(beam)
            state = state.select(torch.arange(rows, device=tr.device).repeat_interleave(beam))
        prev = torch.full((rows * beam,), BOS_ID, dtype=torch.long, device=tr.device)
        return bench_output_layer.median_us(lambda: model.step(prev, state, enc), calls)


def check_rows(rows: int, sentences: int) -> None:
    """A step of `rows` sentences needs that many in the file: else one line, exit 1."""
    if rows > sentences:
        raise SystemExit(f"bench_step.py: --rows {rows}: the file has {sentences} sentences")


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares `t = fixed + per_row × rows` over (rows, µs) points: (fixed, per_row)."""
    xs, ys = [float(r) for r, _ in points], [t for _, t in points]
    per_row, fixed = statistics.linear_regression(xs, ys)
    return fixed, per_row


def rows_of_search(tr: Translator, sources: list[str], beam: int) -> list[int]:
    """The rows of every step of `tr.translate(sources, beam=beam)`, in order."""
    seen: list[int] = []
    step = tr.model.step

    def counted(prev, state, enc):  # type: ignore[no-untyped-def]
        seen.append(prev.size(0))
        return step(prev, state, enc)

    tr.model.step = counted  # type: ignore[method-assign]
    try:
        tr.translate(sources, beam=beam)
    finally:
        del tr.model.step  # the class's method again
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    decoding_options(ap)
    ap.add_argument("--rows", type=wholes(1), default="64,48,32,16,8,1", help="sentences")
    ap.add_argument("--calls", type=whole(1), default=100)
    ap.add_argument("--threads", type=whole(1), default=1)
    ap.add_argument("--rows-of-search", action="store_true", help="count a search's rows too")
    args = ap.parse_args()
    with one_line():  # a checkpoint or file problem
        run(args)


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    sources = read_lines(args.src)
    tr = Translator.from_checkpoint(args.checkpoint, precision=args.precision, int8=args.int8)
    ids = sorted((s.pieces.ids for s in tr.prepare(sources) if s.pieces.ids), key=len)
    check_rows(max(args.rows), len(ids))  # before anything is timed
    start = max(0, len(ids) // 2 - max(args.rows) // 2)  # a batch of the file's mid lengths
    ids = ids[start : start + max(args.rows)][::-1]  # longest first, as a batch is sorted
    how = "int8" if args.int8 else args.precision
    print(f"{args.checkpoint}: {how}, beam {args.beam}, {args.threads} thread(s), median µs a step")
    points = [(r, step_us(tr, ids, r, args.beam, args.calls)) for r in args.rows]
    for r, t in points:
        print(f"  {r} sentences ({r * args.beam} rows), S {len(ids[0])}: {t:,.0f} µs")
    if len(points) > 1:
        fixed, per_row = fit([(r * args.beam, t) for r, t in points])
        print(f"  fit: {fixed:,.0f} µs a step + {per_row:,.1f} µs a row")
    if args.rows_of_search:
        seen = rows_of_search(tr, sources, args.beam)
        full = -(-sum(seen) // max(seen))  # the steps of the same rows, every step full
        small = sum(1 for n in seen if n < max(seen) / 4)
        print(f"  search over {args.src.name}: {len(seen)} steps, {sum(seen):,} rows "
              f"(mean {sum(seen) / len(seen):.1f}); {small} steps under a quarter full; "
              f"{full} steps if every step were full")  # fmt: skip
        print("  rows per step, by sixteens:", sorted(Counter(n // 16 * 16 for n in seen).items()))


if __name__ == "__main__":
    main()
