"""The run before, read back from the file compare_peers.py wrote (--out): for `--redecode`
and `--redecode-onmt`, which decode its models again and keep its training figures, and for
`scripts/runs.py` and `scripts/seeds.py`, which read many. A damaged file is one line for
every reader of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt import typed
from nmt.files import FileError, read_small
from peers.common import Decoding, Result, model_of
from peers.limit import Cpu, Limit


@dataclass(frozen=True)
class PreviousRun:
    """What the run before wrote to --out: its rows and its limits (by limit key), the seed
    and number of updates it trained with (updates 0: a run of --minutes; seed None: a run
    from before --seed), the CPU it measured on (None: a run that did not say), and the
    seconds of its rows' turns (0: one row after another; --interleave) and their minutes,
    and how nmt's rows were set (--nmt-set), every row's rate decayed (--decay) and its weights
    were averaged (--smoothing)."""

    results: list[Result]
    limits: dict[str, Limit]
    seed: int | None = None
    updates: int = 0
    cpu: Cpu | None = None
    interleave: float = 0.0
    minutes: float | None = None  # each row's time budget (0: a run of --updates; None: unsaid)
    nmt_set: tuple[str, ...] = ()  # nmt's overrides, --decay's among them
    decay: tuple[float, ...] | None = None  # --decay's START, EVERY, FACTOR; None: none
    smoothing: float | None = None  # --smoothing's FACTOR; None: none


# A run's file is some 100 KB; a device or an endless pipe named in its place (`/dev/zero`)
# is refused at this size instead of being read until memory is full.
RUN_MAX_BYTES = 16 << 20


def read_run(out: Path, flag: str) -> bytes:
    """The bytes of the file a run wrote, read once (a pipe, `<(cat run.json)`, reads only
    once) and at most RUN_MAX_BYTES of them; a missing or unreadable one is one line."""
    try:
        return read_small(out, RUN_MAX_BYTES, "a run compare_peers.py wrote")
    except FileError as e:
        if not os.path.lexists(out):
            raise SystemExit(
                f"{flag}: no run of compare_peers.py in {out}: file not found"
            ) from None
        raise SystemExit(f"{flag}: {out}: {e}") from None


def previous_run(out: Path, flag: str, data: bytes | None = None) -> PreviousRun:
    """What the run before wrote to --out (`out`), for `flag` (--redecode or --redecode-onmt,
    which decode that run's models again; `scripts/seeds.py`'s runs): its rows and its
    limits, read here once (or given: `data`, what `read_run` read), so that a damaged file
    is one line for every reader of it."""
    damaged = f"{flag}: {out} is not a run compare_peers.py wrote"
    try:
        run = json.loads((read_run(out, flag) if data is None else data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SystemExit(f"{damaged} ({e})") from None
    if not isinstance(run, dict) or not {"results", "limits"} <= run.keys():
        raise SystemExit(f"{damaged} (no results, limits)")
    if not isinstance(run["results"], list) or not isinstance(run["limits"], dict):
        raise SystemExit(f"{damaged} (results not a list, or limits not a mapping)")
    try:  # each field's type checked as a config's are (`nmt.typed.build`)
        own = _typed(_Own, {f.name: run.get(f.name) for f in dataclasses.fields(_Own)}, "run")
        if own.decay and len(own.decay) != 3:
            raise ValueError(f"run: decay: expected START, EVERY, FACTOR, got {own.decay}")
        return PreviousRun(
            [_typed(Result, r, f"results[{i}]") for i, r in enumerate(run["results"])],
            {key: _typed(Limit, d, f"limits.{key}") for key, d in run["limits"].items()},
            own.seed,
            own.updates or 0,
            Cpu(own.cpu, own.cpu_id, tuple(own.cpu_flags or ())) if own.cpu else None,
            own.interleave or 0.0,
            own.minutes,
            tuple(own.nmt_set or ()),
            tuple(own.decay) if own.decay else None,
            own.smoothing or None,
        )
    except ValueError as e:
        raise SystemExit(f"{damaged} ({e})") from None


@dataclass(frozen=True)
class _Own:
    """A run's own fields, besides its rows and limits, as its JSON holds them (None: a run
    from before the field was written)."""

    seed: int | None = typed.option(None, min=0)
    updates: int | None = typed.option(None, min=0)
    cpu: str | None = None  # the CPU's model name, "cpu_id" its family and model
    cpu_id: str | None = None
    cpu_flags: list[str] | None = None
    interleave: float | None = typed.option(None, min=0)  # seconds a turn; 0: none
    minutes: float | None = typed.option(None, min=0)
    nmt_set: list[str] | None = None
    decay: list[float] | None = None
    smoothing: float | None = typed.option(None, above=0, max=1)


def decay_flag(decay: tuple[float, ...] | None) -> str:
    """How a run's learning-rate decay reads: '--decay 800,100,0.5', or 'no --decay'."""
    return "--decay " + ",".join(f"{x:g}" for x in decay) if decay else "no --decay"


def smoothing_flag(factor: float | None) -> str:
    """How a run's weight average reads: '--smoothing 0.0001', or 'no --smoothing'."""
    return f"--smoothing {factor:g}" if factor else "no --smoothing"


def training_flags(run: PreviousRun) -> str:
    """How a run's rows trained beyond the reference's way: '--decay 800,100,0.5',
    '--smoothing 0.0001', both joined by ', ', or '' for neither."""
    flags = [decay_flag(run.decay)] if run.decay else []
    return ", ".join(flags + ([smoothing_flag(run.smoothing)] if run.smoothing else []))


def _typed(cls: type, raw: Any, where: str) -> Any:
    """Dataclass `cls` from `raw`, a ValueError naming `where` and the first problem found."""
    try:
        built, problems = typed.build(cls, raw)
    except TypeError as e:  # a field without a default missing
        raise ValueError(f"{where}: {e}") from None
    if problems:
        raise ValueError(f"{where}: {problems[0]}")
    return built


def check_redecoded(
    results: list[Result], decodings: list[Decoding], args: argparse.Namespace
) -> None:
    """One line (SystemExit) where `--redecode` has a row with nothing to decode (a --work
    that does not hold that run's models): written, --out would lose that row's decodings."""
    undecoded = [r for r in results if not any(d.result is r for d in decodings)]
    if undecoded:
        why = "; ".join(f"{r.name}: {r.note or 'nothing to decode'}" for r in undecoded)
        raise SystemExit(
            f"{args.again}: {why}; is --work the folder that run trained in? "
            f"{args.out} left as it was"
        )


def previous_result(args: argparse.Namespace, name: str) -> Result:
    """`name`'s training figures from --out's previous run (`args.again`), its decodings
    cleared: the row of that model, however it decoded then."""
    for r in previous_run(args.out, args.again).results:
        if model_of(r.name) == name:
            return dataclasses.replace(r, decode={}, curve=[])
    raise SystemExit(f"{args.again}: {args.out} holds no {name} run")


def kept_rows(results: list[Result], out: Path, flag: str) -> list[Result]:
    """The rows of `out`'s previous run (decoding again, as `flag` asks) whose model was not
    run again, as that run left them; a model decoded again another way ("nmt fp32, int8
    decoding" now, "nmt fp32" then) is not kept twice."""
    again = {model_of(r.name) for r in results}
    return [r for r in previous_run(out, flag).results if model_of(r.name) not in again]
