"""How long a model's output runs against its references, and how often it repeats itself.

Why: session 53 found each fall of nmt's greedy validation BLEU came with output too long,
and session 54 traced that length to repeated phrases: the end-of-sentence probability at the
references' ends was the same in every model (0.974-0.980), while the number of validation
sentences with a repeated three-word sequence went 92, 39, 16 over three checkpoints 50
updates apart. This counts that for any hypothesis files, nmt's or a peer's, so that
checkpoints and toolkits can be read side by side.

For each HYP (one sentence a line, aligned with --ref line by line; words split on
whitespace, as the texts are written) it prints:
- the length ratio: the hypotheses' words over the references';
- the sentences with a repeated n-gram (--order, 3): some n words in a row occur twice;
- the runaway sentences: longer than --runaway (1.5) × their reference's words + 2;
- the words written beyond each reference's length, summed over the sentences that overrun.

    .venv/bin/nmt translate -m RUN/step-1100.pt -i ../shared/data/multi30k/val.en \\
        -o /tmp/greedy.fr --beam 1
    .venv/bin/python scripts/repeats.py --ref ../shared/data/multi30k/val.fr /tmp/greedy.fr

Reads files only; nothing is written.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from argtypes import above_zero, whole

from nmt.errors import NmtError, one_line
from nmt.files import read_lines


@dataclass(frozen=True)
class Counts:
    """One hypothesis file against its references."""

    words: int  # the hypotheses' words
    ref_words: int  # the references'
    repeating: int  # sentences with an n-gram occurring twice or more
    runaway: int  # sentences longer than runaway × their reference + 2 words
    overrun: int  # words beyond each reference's length, over the sentences that overrun
    sentences: int

    @property
    def ratio(self) -> float:
        return self.words / self.ref_words


def repeats(words: list[str], order: int) -> bool:
    """Whether some `order` words in a row occur twice or more in `words`."""
    # a window at a time: the work is the sentence's length, whatever --order is
    grams = [tuple(words[i : i + order]) for i in range(len(words) - order + 1)]
    return len(set(grams)) < len(grams)


def count(hyps: list[str], refs: list[str], order: int, runaway: float) -> Counts:
    """`Counts` for hypotheses aligned with references (the same number of lines)."""
    hyp_words = [h.split() for h in hyps]
    ref_words = [r.split() for r in refs]
    pairs = list(zip(hyp_words, ref_words, strict=True))
    return Counts(
        words=sum(len(h) for h in hyp_words),
        ref_words=sum(len(r) for r in ref_words),
        repeating=sum(repeats(h, order) for h in hyp_words),
        runaway=sum(len(h) > runaway * len(r) + 2 for h, r in pairs),
        overrun=sum(max(0, len(h) - len(r)) for h, r in pairs),
        sentences=len(pairs),
    )


def count_options(parser: argparse.ArgumentParser) -> None:
    """--order and --runaway, as `count` takes them (here and in checkpoint_repeats.py)."""
    parser.add_argument("--order", type=whole(1), default=3, help="n of the repeated n-grams (3)")
    parser.add_argument(
        "--runaway",
        type=above_zero("times"),
        default=1.5,
        help="a runaway sentence: over this × its reference + 2 words",
    )


def summary(name: str, c: Counts, order: int, runaway: float) -> str:
    return (
        f"{name}: length ratio {c.ratio:.3f} ({c.words:,} words for {c.ref_words:,}); "
        f"{c.repeating} of {c.sentences:,} sentences repeat a {order}-gram; {c.runaway} over "
        f"{runaway:g} x their reference + 2 words; {c.overrun:,} words beyond the references' "
        "lengths"
    )


def read_pair(hyp: Path, ref: Path, refs: list[str]) -> list[str]:
    """A hypothesis file's lines, checked against the references'."""
    hyps = read_lines(hyp)
    if len(hyps) != len(refs):
        raise NmtError(
            f"{hyp} has {len(hyps)} lines but --ref {ref} has {len(refs)}: they must be "
            "aligned line by line"
        )
    return hyps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hyps", nargs="+", type=Path, help="hypothesis files, a sentence a line")
    parser.add_argument("--ref", type=Path, required=True, help="the references, aligned")
    count_options(parser)
    args = parser.parse_args(argv)
    with one_line():
        refs = read_lines(args.ref)
        if not any(r.split() for r in refs):
            raise NmtError(f"--ref {args.ref}: no words; expected one reference sentence a line")
        for hyp in args.hyps:
            c = count(read_pair(hyp, args.ref, refs), refs, args.order, args.runaway)
            print(summary(str(hyp), c, args.order, args.runaway))


if __name__ == "__main__":
    main()
