"""Where a decoding's time goes across its worker processes (`nmt translate --workers N`):
for each call of `Translator.translate` on a file, when the first batch started (what came
before it is the parent's: cleaning and tokenizing the lines, forking the workers), and for
each worker its batches, the seconds it spent decoding them, and the minor page faults it
took doing so, the first batch apart from the rest.

Why: the workers are forked for each call (`nmt.workers`), so each starts with the parent's
memory shared copy-on-write and its library code not yet mapped in; what a worker writes or
runs first, it faults in a page at a time. Session 39 measured what that costs a greedy int8
decoding of test_2016_flickr (docs/benchmarks.md). With `--warm alternate`, every second call
has each worker decode its first batch once untimed before the timed pass: what a worker that
had decoded before would take, so that the difference is the cost of starting cold.

    .venv/bin/python scripts/worker_timeline.py ~/.cache/nmt-peers/nmt-fp32/step-1000.pt \\
        --src ../shared/data/multi30k/test_2016_flickr.en --int8 [--workers 2] [--beam 1] \\
        [--calls 3] [--warm off|on|alternate] [--batches]

Each call is timed from raw lines, as `compare_peers.py` times nmt's decodings. Only one
benchmark at a time on a small machine: two at once make both figures wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

from argtypes import decoding_options, sentence_lines, whole

import nmt.translate
from nmt.errors import one_line
from nmt.translate import Translator


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed_pool(
    pool: Callable, record: list[tuple[int, float, float, int]], warm: list[bool]
) -> Callable:
    """`nmt.workers.pool` with each job's worker, start, end (`time.perf_counter`, the same
    clock in every process here) and minor page faults appended to `record`, in batch
    order; while `warm[0]`, each worker's first batch decoded once untimed first."""

    @contextlib.contextmanager
    def timed(job: Callable[[Any], Any], workers: int) -> Iterator[Callable]:
        started: set[int] = set()  # each worker's copy: its pid once it has decoded

        def measured(item: Any) -> tuple[Any, tuple[int, float, float, int]]:
            if warm[0] and os.getpid() not in started:
                job(item)
            started.add(os.getpid())
            faults, start = _faults(), time.perf_counter()
            result = job(item)
            return result, (os.getpid(), start, time.perf_counter(), _faults() - faults)

        with pool(measured, workers) as mapped:

            def results(items: Any) -> Iterator[Any]:
                for result, seen in mapped(items):
                    record.append(seen)
                    yield result

            yield results

    return timed


def report(record: list[tuple[int, float, float, int]], began: float, took: float) -> str:
    """One call's lines: its time, when its first batch started, and each worker's."""
    first = min(start for _, start, _, _ in record) - began
    lines = [f"  {took:.3f} s; first batch started at {first:.3f} s"]
    for n, pid in enumerate(dict.fromkeys(p for p, _, _, _ in record)):
        mine = [r for r in record if r[0] == pid]
        busy = [end - start for _, start, end, _ in mine]
        faults = [f for _, _, _, f in mine]
        others = "no other"
        if len(mine) > 1:
            n_others = len(mine) - 1
            others = (
                f"the others {sum(busy[1:]) / n_others:.3f} s and "
                f"{sum(faults[1:]) / n_others:,.0f} on average"
            )
        lines.append(
            f"  worker {n + 1}: {len(mine)} batch{'es' * (len(mine) > 1)}, {sum(busy):.3f} s "
            f"decoding; first batch "
            f"{busy[0]:.3f} s and {faults[0]:,} page faults, {others}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    decoding_options(ap)
    ap.add_argument("--workers", type=whole(1), default=2)
    ap.add_argument("--batch-size", type=whole(1), default=64, help="as compare_peers.py's")
    ap.add_argument("--calls", type=whole(1), default=3, help="timed translations of the file")
    ap.add_argument("--warm", choices=["off", "on", "alternate"], default="off",
                    help="each worker's first batch decoded once untimed first: never, in "
                    "every call, in every second call")  # fmt: skip
    ap.add_argument("--batches", action="store_true", help="print every batch too")
    args = ap.parse_args()
    with one_line():
        lines = sentence_lines(args.src, "--src")
        tr = Translator.from_checkpoint(
            args.checkpoint, precision=args.precision, int8=args.int8, workers=args.workers
        )
    record: list[tuple[int, float, float, int]] = []
    warm = [False]
    nmt.translate.pool = timed_pool(nmt.translate.pool, record, warm)  # type: ignore[attr-defined]
    for call in range(args.calls):
        record.clear()
        warm[0] = args.warm == "on" or (args.warm == "alternate" and call % 2 == 1)
        began = time.perf_counter()
        tr.translate(lines, beam=args.beam, batch_size=args.batch_size)
        took = time.perf_counter() - began
        how = ", workers warmed first (their first batch's time is its second pass)" * warm[0]
        print(f"call {call + 1}{how}:\n{report(record, began, took)}")
        if args.batches:
            for pid, start, end, faults in record:
                print(f"    {pid}: {start - began:.3f}-{end - began:.3f} s, {faults:,} faults")


if __name__ == "__main__":
    main()
