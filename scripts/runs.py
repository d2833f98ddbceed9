"""Several `compare_peers.py` runs side by side, a line each, and each nmt row's figures as a
range over the runs of each CPU: what the README's "Where the targets stand" table quotes.

Why: on a shared machine one run's ratios to OpenNMT-py and shares of the limit move by 20 %
and more with the machine's spells, so issue 25's targets are quoted as the range over every
run of a CPU. Copied by hand from run to run, a range can miss a run or keep a figure that a
run decoded again replaced; read from the runs' files, it is this command's output.

    .venv/bin/python scripts/runs.py [--spread] results/compare_peers_4min_s4[1-8].json \\
        results/compare_peers_1000_updates_int8_s41_seed5_redecoded.json \\
        results/compare_peers_1000_updates_int8_s4[1-8]_seed{6,7,8,9,10,11,12,13,14,15}.json

Each file is a run's --out, of --minutes or of --updates. Training: each nmt row's tokens/s
against OpenNMT-py's in the same run, and its share of the limit measured beside it
(compare_peers' own figures). Decoding: from runs of at least 1,000 updates only (the issue's
decoding target is on models trained for the same number of updates, ≥ 1,000; a run of
--minutes decodes rows that trained different numbers), each row's seconds against
OpenNMT-py's, and where its test BLEU was more than 0.5 below OpenNMT-py's (the target's
condition), how many times. Runs are grouped by the CPU they recorded: its family and model
where they did, as a Zen 4 and a Zen 5 both call themselves "AMD EPYC". A run from before
session 41 recorded neither and is grouped by its flags, which tell an EPYC with AVX2 only from
a Zen 5 but not a Zen 5 from a Zen 4 (session 41's first seed-5 file falls with the Zen 5's;
its `_redecoded` file names the Zen 4); the Zen 5's runs of sessions 16-22 are grouped by the
family their sessions' notes read off `lscpu` (`NOTED_FAMILY`), with a later run's model of it
where the runs read name one. A run given twice (one file by two names, or a copy of it) is
refused: it would weigh twice in every range. Reads files only.

Runs whose learning rate decayed (`compare_peers.py --decay`) or whose weights were averaged
(`--smoothing`) are a group of their own beside their CPU's, one for each setting.

`--spread` adds how much each yardstick moves from run to run on one CPU (`spread_lines`), the
runs whose rows took turns (`compare_peers.py --interleave`) apart from the others.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers/

from peers.common import (  # noqa: E402
    DECODINGS,
    REFERENCE,
    Result,
    finite,
    model_of,
    share_of_limit,
)
from peers.previous import PreviousRun, previous_run, read_run, training_flags  # noqa: E402
from peers.spread import correlation, variation  # noqa: E402

OURS = "nmt"  # the rows whose figures are gathered (their model's name starts so)
DECODING_UPDATES = 1_000  # the fewest updates a run's decodings count from (the issue's)
BLEU_SLACK = 0.5  # the decoding target's condition: BLEU no lower than OpenNMT-py's − this
IN_TURNS = ", rows in turns"  # what --spread adds to the CPU of runs that took turns


@dataclass
class Figures:
    """One nmt model's figures on one CPU, a value a run that gave one."""

    speedup: list[float] = field(default_factory=list)  # training tokens/s × OpenNMT-py
    share: list[float] = field(default_factory=list)  # of the limit beside it, 0-1
    decoding: dict[str, list[float]] = field(default_factory=dict)  # label -> × OpenNMT-py
    below: dict[str, int] = field(default_factory=dict)  # label -> runs > 0.5 BLEU below
    # each training once, (its tokens/s, OpenNMT-py's) -> its share of the limit: a run that
    # decoded a run's models again (--redecode) carries that run's training figures
    trainings: dict[tuple[float, float], float] = field(default_factory=dict)


# The runs from before session 41 (which recorded no family and model) that ran on the Zen 5:
# sessions 18-22's notes read its family off `lscpu` ("CPU family 26 (Zen 5)", and "the same
# machine kind as sessions 16-18"; docs/benchmarks.md), but not its model.
NOTED_FAMILY = dict.fromkeys(
    [
        "compare_peers_1000_updates_bf16.json",
        "compare_peers_1000_updates_int8.json",
        *(f"compare_peers_1000_updates_int8_s{n}.json" for n in (17, 18, 19, 21, 22)),
        "compare_peers_1000_updates_int8_s19_seed2.json",
        "compare_peers_1000_updates_int8_s20_seed3.json",
        "compare_peers_1000_updates_int8_s20_seed4.json",
        "compare_peers_1000_updates_int8_s21_redecoded.json",
        "compare_peers_1000_updates_int8_s21_target_rows.json",
        "compare_peers_1000_updates_int8_s22_redecoded.json",
    ],
    "family 26",
)


def noted_family(path: Path, run: PreviousRun) -> str | None:
    """The family a run's session noted, for a run that recorded no family and model."""
    return None if run.cpu is None or run.cpu.id else NOTED_FAMILY.get(path.name)


def cpu_of(path: Path, run: PreviousRun) -> str:
    """The CPU a run recorded: its name, and its family and model where it recorded them, the
    family its session noted where it did not, else its flags (before session 41: they tell a
    Zen 5 from an EPYC with AVX2 only, both "AMD EPYC", but not a Zen 5 from a Zen 4)."""
    cpu = run.cpu
    if cpu is None:
        return "a CPU the run did not name"
    if family := noted_family(path, run):
        return f"{cpu.name} ({family}, model not recorded)"
    return f"{cpu.name} ({cpu.id or 'flags ' + (' '.join(cpu.flags) or 'unknown')})"


def groups(runs: list[tuple[Path, PreviousRun]]) -> dict[Path, str]:
    """The group each run goes in: its CPU (`cpu_of`), except that a run known by its noted
    family alone joins the runs of that family's one model among those read, where they
    recorded exactly one (the Zen 5 of sessions 16-22 beside a later session's)."""
    group = {path: cpu_of(path, run) for path, run in runs}
    models: dict[tuple[str, str], set[str]] = {}
    for path, run in runs:
        if run.cpu is not None and run.cpu.family:
            models.setdefault((run.cpu.name, run.cpu.family), set()).add(group[path])
    for path, run in runs:
        family = noted_family(path, run)
        if run.cpu is not None and family is not None:
            recorded = models.get((run.cpu.name, family), set())
            if len(recorded) == 1:
                group[path] = next(iter(recorded))
    return group


def what(run: PreviousRun) -> str:
    """How long its rows trained: '1,000 updates, seed 12', or 'a time budget' (--minutes),
    then ', in turns of 20 s' where they took turns (--interleave) and ', --decay
    800,100,0.5' where their learning rate decayed, ', --smoothing 0.0001' where their weights
    were averaged."""
    how = f", in turns of {run.interleave:g} s" if run.interleave else ""
    how += _trained_apart(run)
    if not run.updates:
        return "a time budget" + how
    seed = "" if run.seed is None else f", seed {run.seed}"
    return f"{run.updates:,} updates{seed}{how}"


def ways(group: dict[Path, str], runs: list[tuple[Path, PreviousRun]]) -> dict[Path, str]:
    """`group` with the runs whose rows took turns (--interleave) apart from those whose rows
    trained one after another: for `--spread`, which asks how much a way of measuring moves
    from run to run (and a run in turns reads its tokens/s from its turns' windows)."""
    return {path: group[path] + (IN_TURNS if run.interleave else "") for path, run in runs}


def schedules(group: dict[Path, str], runs: list[tuple[Path, PreviousRun]]) -> dict[Path, str]:
    """`group` with the runs whose learning rate decayed (`compare_peers.py --decay`) or whose
    weights were averaged (`--smoothing`) apart, a group for each setting: their models, and
    so their BLEU and decoding, are others."""
    return {path: group[path] + _trained_apart(run) for path, run in runs}


def _trained_apart(run: PreviousRun) -> str:
    """', --decay 800,100,0.5', ', --smoothing 0.0001', both, or '' for the reference's way."""
    flags = training_flags(run)
    return f", {flags}" if flags else ""


def reference(run: PreviousRun) -> Result | None:
    return next((r for r in run.results if r.name.startswith(REFERENCE)), None)


def ours(run: PreviousRun) -> list[Result]:
    return [r for r in run.results if model_of(r.name).startswith(OURS)]


def tokens(run: PreviousRun, row: Result) -> tuple[float, float] | None:
    """(the row's training tokens/s, OpenNMT-py's in the same run), where both trained."""
    base = reference(run)
    if base is None or not base.tokens_per_s or not row.tokens_per_s:
        return None
    return row.tokens_per_s, base.tokens_per_s


def speedup(run: PreviousRun, row: Result) -> float | None:
    """The row's training tokens/s against OpenNMT-py's in the same run."""
    pair = tokens(run, row)
    return None if pair is None else pair[0] / pair[1]


def share(run: PreviousRun, row: Result) -> float | None:
    """The row's share of the limit measured in its run; None for a row that did not train."""
    return share_of_limit(row, run.limits) or None


def decoding(run: PreviousRun, row: Result, label: str) -> tuple[float, float] | None:
    """(× OpenNMT-py's seconds, BLEU − OpenNMT-py's) of one decoding, where the run counts
    for decoding and both rows have it."""
    base = reference(run)
    if base is None or run.updates < DECODING_UPDATES:
        return None
    mine, theirs = row.decode.get(label) or {}, base.decode.get(label) or {}
    figures = [d.get(k) for d in (mine, theirs) for k in ("seconds", "bleu")]
    if not all(finite(x) for x in figures) or not mine["seconds"] or not theirs["seconds"]:
        return None
    return theirs["seconds"] / mine["seconds"], mine["bleu"] - theirs["bleu"]


def gather(
    runs: list[tuple[Path, PreviousRun]], group: dict[Path, str]
) -> dict[str, dict[str, Figures]]:
    """CPU group -> nmt model -> its figures over that group's runs, in the order first met."""
    by_cpu: dict[str, dict[str, Figures]] = {}
    for path, run in runs:
        for row in ours(run):
            f = by_cpu.setdefault(group[path], {}).setdefault(model_of(row.name), Figures())
            pair, its_share = tokens(run, row), share(run, row)
            for values, value in ((f.speedup, speedup(run, row)), (f.share, its_share)):
                if value is not None:
                    values.append(value)
            if pair is not None and its_share is not None:
                f.trainings.setdefault(pair, its_share)
            for label, _ in DECODINGS:
                d = decoding(run, row, label)
                if d is not None:
                    f.decoding.setdefault(label, []).append(d[0])
                    f.below[label] = f.below.get(label, 0) + (d[1] < -BLEU_SLACK)
    return by_cpu


def span(values: Iterable[float], unit: str, digits: int = 2) -> str:
    """'1.43-1.81×' from the values, then `unit` (one value: itself; none: '-')."""
    v = sorted(values)
    if not v:
        return "-"
    lo, hi = f"{v[0]:.{digits}f}", f"{v[-1]:.{digits}f}"
    return (lo if lo == hi else f"{lo}-{hi}") + unit


def run_lines(runs: list[tuple[Path, PreviousRun]]) -> list[str]:
    """A run a line: its file, CPU, training, OpenNMT-py's tokens/s and each nmt row's
    figures."""
    lines = [
        "| run | CPU | trained | OpenNMT-py tokens/s | each nmt row: × OpenNMT-py, % of limit"
        + "".join(f", {label} ×" for label, _ in DECODINGS)
        + " |",
        "|---|---|---|---|---|",
    ]
    for path, run in runs:
        base = reference(run)
        cells = [
            path.name,
            cpu_of(path, run),
            what(run),
            f"{base.tokens_per_s:,.0f}" if base else "-",
            "; ".join(row_figures(run, row) for row in ours(run)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def row_figures(run: PreviousRun, row: Result) -> str:
    """'nmt fp32 1.61×, 56.9 %, greedy 4.89×, beam5 5.92×' ('-' for a figure it lacks)."""
    x, s = speedup(run, row), share(run, row)
    said = [f"{model_of(row.name)} " + ("-" if x is None else f"{x:.2f}×")]
    said.append("-" if s is None else f"{100 * s:.1f} %")
    for label, _ in DECODINGS:
        d = decoding(run, row, label)
        if d is not None:
            said.append(f"{label} {d[0]:.2f}×")
    return ", ".join(said)


def range_lines(by_cpu: dict[str, dict[str, Figures]], counts: Counter[str]) -> list[str]:
    """A line for each CPU and nmt model: the range of each figure over its runs."""
    labels = [label for label, _ in DECODINGS]
    lines = [
        "| CPU (runs) | row | training × OpenNMT-py | % of limit | "
        + " | ".join(f"{label} ×, runs > {BLEU_SLACK} BLEU below" for label in labels)
        + " |",
        "|---" * (4 + len(labels)) + "|",
    ]
    for cpu, models in by_cpu.items():
        for model, f in models.items():
            cells = [
                f"{cpu} ({counts[cpu]})",
                model,
                span(f.speedup, "×"),
                span((100 * s for s in f.share), " %", digits=1),
            ]
            for label in labels:
                got = f.decoding.get(label, [])
                below = f"{f.below.get(label, 0)} of {len(got)}" if got else ""
                cells.append(f"{span(got, '×')}, {below}" if got else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def spread(values: list[float]) -> str:
    """The coefficient of variation, standard deviation over mean: '6.2 %'."""
    return f"{100 * variation(values):.1f} %"


def spread_lines(by_cpu: dict[str, dict[str, Figures]]) -> list[str]:
    """How much each yardstick moves from training to training, for each CPU and nmt model
    with three trainings or more (each once, however many runs decoded its models): the spread
    of OpenNMT-py's tokens/s, of the row's, of the ratio of the two, of the row's share of the
    limit and of the limit itself; and how far the two toolkits' tokens/s move together
    (Pearson's r). A same-run ratio cancels the machine's state only as far as both trainings
    meet the same state: where r is near 0 (spells shorter than the run), the ratio moves more
    than either tokens/s. Runs whose rows took turns (--interleave) are a group of their own
    beside their CPU's other runs (`ways`)."""
    lines = [
        "| CPU | row | trainings | OpenNMT-py tokens/s | its tokens/s | × OpenNMT-py "
        "| % of limit | the limit | r, its tokens/s and OpenNMT-py's |",
        "|---" * 9 + "|",
    ]
    for cpu, models in by_cpu.items():
        for model, f in models.items():
            if len(f.trainings) < 3:
                continue
            mine, theirs = (list(t) for t in zip(*f.trainings, strict=True))
            ratio = [m / t for m, t in f.trainings]
            shares = list(f.trainings.values())
            limit = [m / s for m, s in zip(mine, shares, strict=True)]  # tokens/s
            r = correlation(mine, theirs)
            cells = [cpu, model, str(len(f.trainings))]
            cells += [spread(v) for v in (theirs, mine, ratio, shares, limit)]
            cells.append("-" if r is None else f"{r:.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else ["spread: no CPU has three trainings of an nmt row"]


def read_once(paths: list[Path]) -> list[tuple[Path, PreviousRun]]:
    """Each file's run, refusing a run given twice: one file under two names, or a copy of it
    (the same JSON, however it is laid out: nothing in a run's file names the run, and a run
    counted twice would weigh twice in every range and spread)."""
    seen: dict[Path | str, Path] = {}
    runs = []
    for path in paths:
        same = seen.setdefault(path.resolve(), path)
        if same is not path:
            raise SystemExit(f"runs.py: {path} is named twice ({same}); expected each run once")
        data = read_run(path, "runs.py")  # once: a pipe reads once
        run = previous_run(path, "runs.py", data)  # a non-run: its own one line
        content = json.dumps(json.loads(data), sort_keys=True)  # parsed above
        same = seen.setdefault(content, path)
        if same is not path:
            raise SystemExit(
                f"runs.py: {path} holds the same run as {same} (the same JSON); "
                "expected each run once"
            )
        runs.append((path, run))
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", type=Path, nargs="+", help="compare_peers.py --out files")
    ap.add_argument(
        "--spread",
        action="store_true",
        help="also how much each figure moves from training to training on each CPU "
        "(standard deviation over mean), and how far the toolkits' tokens/s move together",
    )
    args = ap.parse_args(argv)
    runs = read_once(args.runs)
    group = schedules(groups(runs), runs)
    counts = Counter(group.values())
    by_cpu = gather(runs, group)
    if not by_cpu:
        raise SystemExit(f"runs.py: no run has a row whose name starts with {OURS!r}")
    print("\n".join(run_lines(runs)))
    print()
    print("\n".join(range_lines(by_cpu, counts)))
    named = {group[path]: run.cpu.flags for path, run in runs if run.cpu and run.cpu.id}
    for cpu, flags in named.items():  # a group without family and model is named by its flags
        print(f"{cpu}: flags {' '.join(flags) or 'unknown'}")
    if args.spread:
        print()
        print("\n".join(spread_lines(gather(runs, ways(group, runs)))))


if __name__ == "__main__":
    main()
