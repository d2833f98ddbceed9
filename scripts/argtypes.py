"""argparse types for the scripts' numbers: a value out of range is argparse's own one-line
error (`error: argument --seed: '0': expected a whole number >= 1`), before any work. And the
one check of a file of sentences a script decodes (`sentence_lines`), and the options every
decoding benchmark takes (`decoding_options`).

    from argtypes import above_zero, minutes, sentence_lines, some_of, whole, wholes
    ap.add_argument("--repeats", type=whole(1), default=3)
    ap.add_argument("--beams", type=wholes(1), default="1,5")
    ap.add_argument("--parts", type=some_of(PARTS), default="scorer")
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from pathlib import Path

from nmt.errors import NmtError
from nmt.files import read_lines


def whole(minimum: int) -> Callable[[str], int]:
    """'3' -> 3: one whole number of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= {minimum}")
        return value

    return parse


def wholes(minimum: int) -> Callable[[str], list[int]]:
    """'1,5' -> [1, 5]: comma-separated whole numbers, each at least `minimum`."""
    one = whole(minimum)

    def parse(text: str) -> list[int]:
        try:
            return [one(part) for part in text.split(",")]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected whole numbers >= {minimum}, comma-separated"
            ) from None

    return parse


def some_of(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """'scorer,gates,scorer' -> ['scorer', 'gates']: comma-separated names, each one of
    `choices`, each once (a name given twice would be timed or checked twice)."""
    known = list(choices)

    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(text.split(",")))
        if unknown := [n for n in names if n not in known]:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))}; expected some of {', '.join(known)}"
            )
        return names

    return parse


def above_zero(unit: str) -> Callable[[str], float]:
    """'4' or '0.5' -> 4.0 or 0.5: a finite number of `unit` (minutes, seconds) above 0."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number of {unit} above 0")
        return value

    return parse


minutes = above_zero("minutes")


def sentence_lines(path: Path, flag: str) -> list[str]:
    """The lines of `path` (option `flag`), a file of sentences to decode or send: one line
    (`NmtError`) where it cannot be read or holds none, before any work (a benchmark of
    nothing would print figures of 0 s)."""
    lines = read_lines(path)
    if not any(line.strip() for line in lines):
        raise NmtError(f"{flag} {path}: no sentence to decode (empty or blank lines only)")
    return lines


def decoding_options(ap: argparse.ArgumentParser) -> None:
    """What a decoding benchmark decodes and how: the checkpoint, `--src`, `--precision`,
    `--int8` and `--beam`."""
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--src", type=Path, required=True, help="source sentences, one a line")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--beam", type=whole(1), default=1)
