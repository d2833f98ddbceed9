"""How far a model's validation BLEU moves from one validation to the next: learning curves
read side by side.

Why: issue 25's "BLEU after N updates no lower than OpenNMT-py's" reads each model once, at
update N. Where a curve swings between validations, that one reading carries the swing:
session 52 found nmt's BLEU moving a median 2.37 points between validations 50 updates apart
(OpenNMT-py's 0.75). This reads the curves and says, for each, how far it moves.

Each PATH is either an nmt run folder (its metrics.jsonl: every validation, with its loss) or
a `compare_peers.py --curve` run's JSON file (each row's curve: BLEU only). For the
validations from --start to --stop it prints the median and the largest move of BLEU from one
validation to the next, the mean BLEU from --mean-from to --stop, and for nmt runs the median
move of the validation loss; --table prints each curve's BLEU at each update as well.

    .venv/bin/python scripts/curves.py results/compare_peers_1200_updates_curve50_s52.json \\
        runs/reference_rnn --start 600 --stop 1200 --mean-from 900

Reads files only; nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from nmt.report import read_metrics
from nmt.run_dir import METRICS_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers/

from peers.common import finite  # noqa: E402
from peers.previous import previous_run  # noqa: E402


@dataclass(frozen=True)
class Curve:
    """One model's validations: BLEU (and nmt's loss, else None) by update."""

    name: str
    bleu: dict[int, float]
    loss: dict[int, float] | None


def checked(curve: Curve, where: Path) -> Curve:
    """An nmt run's `curve`, or one line (SystemExit) naming the update whose BLEU or loss is
    not a finite number (a diverged run's NaN would make every median below meaningless; a
    compare_peers.py run's curve is checked as it is read, by `previous_run`)."""
    for what, values in (("BLEU", curve.bleu), ("loss", curve.loss or {})):
        for step, value in values.items():
            if not finite(value):
                raise SystemExit(
                    f"curves.py: {where}: {curve.name}'s validation {what} at update {step} is "
                    f"{value}, not a finite number"
                )
    return curve


def nmt_curve(folder: Path) -> Curve:
    """An nmt run folder's validations, from its metrics.jsonl."""
    path = folder / METRICS_NAME
    bleu: dict[int, float] = {}
    loss: dict[int, float] = {}
    try:
        for row in read_metrics(folder):
            if row.get("val_bleu") is not None:
                bleu[int(row["step"])] = float(row["val_bleu"])
                loss[int(row["step"])] = float(row["val_loss"])
    except FileNotFoundError:
        raise SystemExit(f"curves.py: {folder}: no {METRICS_NAME}: not an nmt run folder") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"curves.py: {path} is not a run's metrics ({e!r})") from None
    return checked(Curve(str(folder), bleu, loss), path)


def peer_curves(path: Path) -> list[Curve]:
    """A compare_peers.py run's rows that have a curve (--curve)."""
    run = previous_run(path, "curves.py")
    curves = []
    for row in run.results:
        try:
            bleu = {int(p["step"]): float(p["val_bleu"]) for p in row.curve}
        except (KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"curves.py: {path}: {row.name}'s curve is damaged ({e!r})") from None
        if bleu:
            curves.append(Curve(f"{path.name}: {row.name}", bleu, None))  # finite: typed
    if not curves:
        raise SystemExit(f"curves.py: {path}: no row has a curve (a run of --curve has)")
    return curves


def read(paths: list[Path]) -> list[Curve]:
    """Every curve the paths hold, in their order."""
    for p in paths:
        if not p.exists():
            raise SystemExit(
                f"curves.py: {p}: no such file or folder (an nmt run folder, or a "
                "compare_peers.py run's JSON)"
            )
    return [c for p in paths for c in ([nmt_curve(p)] if p.is_dir() else peer_curves(p))]


def moves(values: list[float]) -> list[float]:
    """|change| from each value to the next."""
    return [abs(b - a) for a, b in zip(values, values[1:], strict=False)]


def summary(curve: Curve, start: int, stop: int, mean_from: int) -> str:
    """One line: the curve's moves between validations in [start, stop] and its mean."""
    steps = sorted(s for s in curve.bleu if start <= s <= stop)
    if len(steps) < 2:
        return f"{curve.name}: fewer than two validations in updates {start}-{stop}"
    bleu = moves([curve.bleu[s] for s in steps])
    tail = [curve.bleu[s] for s in steps if s >= mean_from]
    text = (
        f"{curve.name}: {len(steps)} validations, updates {steps[0]}-{steps[-1]}; BLEU moves a "
        f"median {statistics.median(bleu):.2f} (at most {max(bleu):.2f})"
    )
    if tail:
        text += f"; mean BLEU over {mean_from}-{steps[-1]} {statistics.mean(tail):.2f}"
    if curve.loss is not None:
        loss = moves([curve.loss[s] for s in steps])
        text += f"; validation loss moves a median {statistics.median(loss):.3f}"
    return text


def table(curves: list[Curve], start: int, stop: int) -> list[str]:
    """The curves' BLEU at each update in [start, stop], a markdown table ("" where one has
    no validation at that update)."""
    steps = sorted({s for c in curves for s in c.bleu if start <= s <= stop})
    lines = ["| update | " + " | ".join(f"{s:,}" for s in steps) + " |"]
    lines.append("|---|" + "---|" * len(steps))
    for c in curves:
        cells = (f"{c.bleu[s]:.1f}" if s in c.bleu else "" for s in steps)
        lines.append(f"| {c.name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="nmt run folders, compare_peers.py runs' JSON"
    )
    parser.add_argument("--start", type=int, default=600, help="first update read (600)")
    parser.add_argument("--stop", type=int, default=1200, help="last update read (1200)")
    parser.add_argument("--mean-from", type=int, default=900, help="the mean's first update")
    parser.add_argument("--table", action="store_true", help="each BLEU value, as markdown")
    args = parser.parse_args(argv)
    if not 0 <= args.start < args.stop:
        parser.error(f"--start {args.start} and --stop {args.stop}: need 0 <= start < stop")
    curves = read(args.paths)
    for c in curves:
        print(summary(c, args.start, args.stop, args.mean_from))
    if args.table:
        print("\n".join(["", *table(curves, args.start, args.stop)]))


if __name__ == "__main__":
    main()
