"""BLEU after the same number of updates over several seeds: `compare_peers.py --updates N
--seed S` runs read side by side.

Why: after 1,000 updates of the reference model, BLEU moves more between seeds than between
the toolkits (OpenNMT-py's greedy test BLEU was 43.2-46.1 over seeds 1-4 on an AMD EPYC), so
issue 25's "BLEU after N updates no lower than OpenNMT-py's" is read from several seeds.
Each run trains every row from the same seed and pieces, so the comparison is seed by seed:
each row's difference from OpenNMT-py's at each seed, the mean of those differences, and
its standard error (their standard deviation / √n).

    .venv/bin/python scripts/seeds.py results/compare_peers_1000_updates_int8_s34_passes.json \\
        results/compare_peers_1000_updates_int8_s40_seed{2,3,4}.json

Each file is a run's --out. The runs are of one number of updates and one learning-rate
schedule (`compare_peers.py --decay` or none) and one weight average (`--smoothing` or none),
and of seeds of their own.
A row is a model ("nmt fp32", however it decoded); one missing from a run, or whose decoding
BLEU is missing from it (a run stopped while decoding: `--redecode` fills it), is left out,
said below the table. Runs of several CPUs are read alike (BLEU barely moves with the
machine: OpenNMT-py's seed 2 reads 46.06 / 46.25 on a Xeon and 46.04 / 46.16 on an AMD EPYC),
and each seed's CPU is said below the table. Reads files only; nothing is written.

`--against FILES` reads a second set of runs of the same seeds, trained another way (without
`--decay`, say), and adds what that way moved in each toolkit alone: each model's BLEU in the
first set less its BLEU in the second, seed by seed, with the cells that rose.

    .venv/bin/python scripts/seeds.py \\
        results/compare_peers_1000_updates_int8_decay_s56_seed{1,2,3,4}.json \\
        --against results/compare_peers_1000_updates_int8_s53_seed{1,2,3,4}.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers/

from peers.common import (  # noqa: E402
    DECODINGS,
    REFERENCE,
    TEST,
    finite,
    model_of,
)
from peers.previous import (  # noqa: E402
    PreviousRun,
    decay_flag,
    previous_run,
    smoothing_flag,
    training_flags,
)


@dataclass(frozen=True)
class Seeds:
    """Each model's BLEU by decoding label, one value a run (runs in seed order)."""

    seeds: list[int]
    updates: int
    bleu: dict[str, dict[str, list[float]]]  # model -> label -> BLEU at each seed
    left_out: list[str]  # why a model is not in `bleu`
    cpus: list[str]  # the CPU each run measured on, as it recorded it ("" where it did not)


def checked_runs(paths: list[Path]) -> list[tuple[Path, PreviousRun]]:
    """The runs, in seed order; one line (SystemExit) naming the file where a run is of
    --minutes, of another number of updates, learning-rate decay or weight average than the
    first, or of a seed already read."""
    runs = [(p, previous_run(p, "seeds.py")) for p in paths]
    first, seen = runs[0], {}
    for path, run in runs:
        if run.updates == 0:
            raise SystemExit(
                f"seeds.py: {path} is a run of --minutes: its rows trained different numbers "
                "of updates; expected runs of --updates N"
            )
        if run.updates != first[1].updates:
            raise SystemExit(
                f"seeds.py: {path} trained {run.updates} updates, {first[0]} "
                f"{first[1].updates}; expected runs of one number of updates"
            )
        if run.decay != first[1].decay:  # BLEU after N updates moves with the schedule
            raise SystemExit(
                f"seeds.py: {path} trained with {decay_flag(run.decay)}, {first[0]} with "
                f"{decay_flag(first[1].decay)}; expected runs of one learning-rate schedule"
            )
        if run.smoothing != first[1].smoothing:  # and with the weights' average
            raise SystemExit(
                f"seeds.py: {path} trained with {smoothing_flag(run.smoothing)}, {first[0]} "
                f"with {smoothing_flag(first[1].smoothing)}; expected runs of one weight average"
            )
        if run.seed is None:
            raise SystemExit(f"seeds.py: {path} has no seed (a run from before --seed)")
        if run.seed in seen:
            raise SystemExit(
                f"seeds.py: {path} is seed {run.seed} again ({seen[run.seed]}); "
                "expected runs of seeds of their own"
            )
        seen[run.seed] = path
    return sorted(runs, key=lambda r: r[1].seed or 0)


def gather(runs: list[tuple[Path, PreviousRun]]) -> Seeds:
    """Each model's BLEU at each seed, for the models every run decoded both ways."""
    models = list(dict.fromkeys(model_of(r.name) for _, run in runs for r in run.results))
    bleu: dict[str, dict[str, list[float]]] = {}
    left_out = []
    for model in models:
        by_label: dict[str, list[float]] = {label: [] for label, _ in DECODINGS}
        for path, run in runs:
            row = next((r for r in run.results if model_of(r.name) == model), None)
            missing = [] if row is not None else ["row"]
            for label, values in by_label.items():
                value = None if row is None else row.decode.get(label, {}).get("bleu")
                if finite(value):
                    values.append(float(value))
                elif row is not None:
                    missing.append(f"{label} BLEU")
            if missing:
                left_out.append(f"{model}: {path} has no {' or '.join(missing)}")
                break
        else:
            bleu[model] = by_label
    seeds = [run.seed or 0 for _, run in runs]
    cpus = [str(run.cpu or "") for _, run in runs]
    return Seeds(seeds, runs[0][1].updates, bleu, left_out, cpus)


def difference(values: list[float], reference: list[float]) -> str:
    """Mean of the seed-by-seed differences, ± their standard error where n > 1: '+0.08 ± 0.44'."""
    d = [v - r for v, r in zip(values, reference, strict=True)]
    mean = statistics.fmean(d)
    if len(d) < 2:
        return f"{mean:+.2f}"
    return f"{mean:+.2f} ± {statistics.stdev(d) / len(d) ** 0.5:.2f}"


def table(s: Seeds) -> list[str]:
    """The markdown table: a model a line, 'greedy / beam 5' in each cell."""
    labels = [label for label, _ in DECODINGS]
    reference = next((m for m in s.bleu if m.startswith(REFERENCE)), None)
    head = [f"seed {n}" for n in s.seeds] + ["mean"]
    if reference is not None:
        head.append(f"− {reference} (± s.e.)")
    lines = [
        f"| {s.updates:,} updates, {TEST} BLEU, {' / '.join(labels)} | {' | '.join(head)} |",
        "|---" * (len(head) + 1) + "|",
    ]
    for model, by_label in s.bleu.items():
        cells = [
            " / ".join(f"{by_label[label][i]:.2f}" for label in labels) for i in range(len(s.seeds))
        ]
        cells.append(" / ".join(f"{statistics.fmean(by_label[label]):.2f}" for label in labels))
        if reference is not None:
            ref = s.bleu[reference]
            same = model == reference
            cells.append(
                "" if same else " / ".join(difference(by_label[k], ref[k]) for k in labels)
            )
        lines.append(f"| {model} | {' | '.join(cells)} |")
    return lines


def against_table(s: Seeds, other: Seeds, how: str, how_other: str) -> list[str]:
    """Each model of both sets: its BLEU in `s` less its BLEU in `other`, seed by seed (mean ±
    standard error), and how many of its cells rose: what training `how` instead of
    `how_other` moved in that toolkit alone."""
    if s.seeds != other.seeds or s.updates != other.updates:
        raise SystemExit(
            f"seeds.py: --against: seeds {_listed(other.seeds)} after {other.updates:,} updates, "
            f"the runs seeds {_listed(s.seeds)} after {s.updates:,}; expected the same seeds "
            "and updates"
        )
    labels = [label for label, _ in DECODINGS]
    lines = [
        f"| {how} − {how_other}, seed by seed | {' / '.join(labels)} (± s.e.) | cells that rose |",
        "|---|---|---|",
    ]
    for model, by_label in s.bleu.items():
        if model not in other.bleu:
            continue
        them = other.bleu[model]
        rose = sum(v > r for k in labels for v, r in zip(by_label[k], them[k], strict=True))
        moved = " / ".join(difference(by_label[k], them[k]) for k in labels)
        lines.append(f"| {model} | {moved} | {rose} of {len(labels) * len(s.seeds)} |")
    if len(lines) == 2:
        raise SystemExit("seeds.py: --against: no model is in both sets of runs")
    return lines


def _listed(seeds: list[int]) -> str:
    return ", ".join(str(n) for n in seeds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", type=Path, nargs="+", help="compare_peers.py --out files, a seed each")
    ap.add_argument(
        "--against",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="runs of the same seeds trained another way: each model's BLEU moved seed by seed",
    )
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        ap.error("expected at least two runs, a seed each")
    runs = checked_runs(args.runs)
    s = gather(runs)
    if not s.bleu:
        raise SystemExit("seeds.py: no model was decoded in every run: " + "; ".join(s.left_out))
    print("\n".join(table(s)))
    if not any(m.startswith(REFERENCE) for m in s.bleu):
        print(f"no {REFERENCE} row in every run: no differences to show")
    for why in s.left_out:
        print(f"left out: {why}")
    if len(set(s.cpus)) > 1:  # BLEU barely moves with the machine; the reader is told anyway
        for seed, cpu in zip(s.seeds, s.cpus, strict=True):
            print(f"seed {seed} ran on {cpu or 'a CPU its run did not name'}")
    if args.against:
        others = checked_runs(args.against)
        how, how_other = (training_flags(r[0][1]) or "the reference's way" for r in (runs, others))
        if how == how_other:
            raise SystemExit(f"seeds.py: --against: both sets of runs trained with {how}")
        print()
        print("\n".join(against_table(s, gather(others), how, how_other)))


if __name__ == "__main__":
    main()
