"""Decoding speed of two revisions of nmt, measured in turn: before and after a change.

On a small shared machine speed drifts by 10-25 % within an hour, so a figure measured now
does not compare with one measured earlier. This script runs the two sides alternately, each
in a fresh process: A, B, A, B, ... Each process loads the checkpoint, prepares the file's
sentences, translates the first 200 once (oneDNN builds its kernels, the heap grows), then
times `--calls` translations of the whole file and reports their median and a digest of the
output, so that a change meant to keep the output shows whether it did. With `--from-text`
each timed call translates the file's lines as read, their cleaning and tokenizing
(`Translator.prepare`) inside the time, as `nmt translate` and `compare_peers.py` time it.

    .venv/bin/python scripts/ab_decode.py HEAD~1 . ~/.cache/nmt-peers/nmt-fp32/step-1000.pt \
        --src ../shared/data/multi30k/test_2016_flickr.en [--int8 | --precision bf16] \
        [--beam 1] [--workers 1] [--threads 2] [--pairs 3] [--calls 5] [--from-text]

A revision is what `git rev-parse` reads (a commit, a branch, HEAD~1), checked out into a
temporary git worktree for the run and removed after it; `.` is this checkout as it is,
uncommitted changes included. Only one benchmark at a time on a small machine: two at once
make both figures wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from argtypes import decoding_options, sentence_lines, whole

from nmt.checkpoint import load_checkpoint
from nmt.errors import one_line
from nmt.run_dir import resolve_checkpoint

ROOT = Path(__file__).resolve().parents[1]

# What each process runs: nmt imported from the tree given, not from the installed one.
CHILD = """
import hashlib, json, statistics, sys, time
from pathlib import Path
tree, checkpoint, src, beam, precision, int8, workers, threads, calls, text = sys.argv[1:11]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]  # pip install -e
sys.path.insert(0, tree)
import torch
torch.set_num_threads(int(threads))
from nmt.files import read_lines
from nmt.translate import Translator
tr = Translator.from_checkpoint(
    checkpoint, precision=precision, int8=int8 == "int8", workers=int(workers)
)
lines = read_lines(Path(src))
ready = tr.prepare(lines)
tr.translate(ready[:200], beam=int(beam))
times = []
for _ in range(int(calls)):
    start = time.perf_counter()
    out = tr.translate(lines if text == "text" else ready, beam=int(beam))
    times.append(time.perf_counter() - start)
digest = hashlib.sha256("\\n".join(t.text for t in out).encode()).hexdigest()[:12]
print(json.dumps({"median": statistics.median(times), "times": times, "digest": digest}))
"""


@contextlib.contextmanager
def checked_out(revision: str) -> Iterator[Path]:
    """The tree of `revision`: this checkout for `.`, else a temporary git worktree of it,
    removed afterwards."""
    if revision == ".":
        yield ROOT
        return
    commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}").strip()
    with tempfile.TemporaryDirectory(prefix="ab_decode_") as tmp:
        tree = Path(tmp) / "tree"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            yield tree
        finally:
            _git("worktree", "remove", "--force", str(tree))


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ab_decode.py: git {args[0]} {args[-1]}: {done.stderr.strip()}")
    return done.stdout


def measure(tree: Path, args: argparse.Namespace) -> dict:
    """One fresh process of `tree`'s nmt decoding the file: its median, times and digest."""
    how = [args.beam, args.precision, "int8" if args.int8 else "-", args.workers, args.threads]
    argv = [str(tree), str(args.checkpoint), str(args.src), *map(str, how), str(args.calls)]
    argv.append("text" if args.from_text else "prepared")
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"ab_decode.py: decoding with {tree} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the revision before (a commit, a branch, or . for this checkout)")
    ap.add_argument("b", help="the revision after")
    decoding_options(ap)
    ap.add_argument("--workers", type=whole(1), default=1)
    ap.add_argument("--threads", type=whole(1), default=2)
    ap.add_argument("--pairs", type=whole(1), default=3, help="A then B, this many times")
    ap.add_argument("--calls", type=whole(1), default=5, help="timed translations a process")
    ap.add_argument(
        "--from-text", action="store_true", help="time the lines' preparing (tokenizing) too"
    )
    args = ap.parse_args()
    with one_line():  # what every process reads, checked once here
        sentence_lines(args.src, "--src")
        load_checkpoint(resolve_checkpoint(args.checkpoint), mmap=True)
    how = "int8" if args.int8 else args.precision
    what = "text" if args.from_text else "prepared sentences"
    print(f"{args.src.name} ({what}), {how}, beam {args.beam}, {args.workers} worker(s), "
          f"{args.threads} thread(s): medians of {args.calls} calls, s")  # fmt: skip
    with checked_out(args.a) as tree_a, checked_out(args.b) as tree_b:
        runs: dict[str, list[dict]] = {"a": [], "b": []}
        for pair in range(args.pairs):
            for side, tree in (("a", tree_a), ("b", tree_b)):
                runs[side].append(measure(tree, args))
            a, b = runs["a"][-1], runs["b"][-1]
            print(f"pair {pair + 1}: {args.a} {a['median']:.3f}, {args.b} {b['median']:.3f} "
                  f"({b['median'] / a['median']:.3f}x the time)")  # fmt: skip
    medians = {side: statistics.median(r["median"] for r in rs) for side, rs in runs.items()}
    digests = {side: {r["digest"] for r in rs} for side, rs in runs.items()}
    same = "the same output" if digests["a"] == digests["b"] else "different outputs"
    print(f"median of pairs: {args.a} {medians['a']:.3f}, {args.b} {medians['b']:.3f}; {same}")


if __name__ == "__main__":
    main()
