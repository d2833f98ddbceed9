"""Greedy output of kept checkpoints, nmt's and OpenNMT-py's, read for BLEU, length and
repetition, step by step side by side: session 54's hand-made counts in one command.

Why: nmt's greedy validation BLEU moves more from one checkpoint to the next than
OpenNMT-py's (`scripts/curves.py`), and session 54 traced the falls to repeated phrases: at
seed 2's updates 1,100, 1,150 and 1,200, 92, 39 and 16 validation sentences repeated a
three-word sequence, against OpenNMT-py's 12, 13 and 8. Two seeds are too few to tell a
model difference from checkpoint noise; this makes the count for any run of
`compare_peers.py --curve`.

For each update N at which an nmt run kept a checkpoint (RUN/step-N.pt; the runs are
WORK's nmt-* folders and any --nmt RUN), and where OpenNMT-py saved one in WORK
(onmt-run/model_step_N.pt: its curve runs keep all of them), it decodes --data's
validation split greedily:
- nmt as `nmt translate --beam 1 --precision P` does (its shortlist, in --precision);
- OpenNMT-py as `compare_peers.py` decodes (`onmt_translate -beam_size 1 -max_length 100`
  on WORK's pieces, with WORK's own OpenNMT-py).

Then it prints a table: for each model and update, validation BLEU (sacreBLEU's default, as
`nmt eval` computes it); the length ratio; the sentences repeating an n-gram (--order); and
the runaway sentences (over --runaway × their reference + 2 words). These are
`scripts/repeats.py`'s counts, in words. --steps picks the updates; a model without a
checkpoint there gets an empty cell.

    .venv/bin/python scripts/checkpoint_repeats.py --work /tmp/curve3 \\
        --data ../shared/data/multi30k [--nmt /tmp/other/nmt-fp32] [--keep /tmp/hyps]

The hypotheses go to a temporary folder, removed at exit, or with --keep to a new folder
(LABEL.step-N.fr). Nothing else is written. Decoding is a benchmark's load: one at a time
on a small machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from nmt import Translator, evaluate
from nmt.errors import NmtError, one_line
from nmt.files import read_lines, write_lines
from nmt.run_dir import step_checkpoints, step_of

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers/, repeats

from argtypes import whole  # noqa: E402
from peers.common import REFERENCE, depiece, sh, shared_of  # noqa: E402
from peers.opennmt import (  # noqa: E402
    CHECKPOINTS,
    RUN_FOLDER,
    VENV,
    checkpoint_step,
    decoding_env,
    own_env,
    translate_command,
)
from repeats import Counts, count, count_options  # noqa: E402

VAL = "val"


@dataclass(frozen=True)
class Model:
    """One model's kept checkpoints by update, and how to decode one into a file."""

    label: str
    checkpoints: dict[int, Path]
    decode: Callable[[Path, Path], list[str]]  # checkpoint, hypothesis file -> the sentences


def nmt_model(run: Path, data: Path, precision: str) -> Model:
    """An nmt run's model: greedy search as `nmt translate --beam 1` runs it."""
    sources = read_lines(data / f"{VAL}.en")

    def decode(checkpoint: Path, out: Path) -> list[str]:
        translator = Translator.from_checkpoint(checkpoint, precision=precision)
        hyps = [t.text for t in translator.translate(sources, beam=1)]
        write_lines(out, hyps)
        return hyps

    kept = {n: p for p in step_checkpoints(run) if (n := step_of(p)) is not None}
    return Model(run.name, kept, decode)


def onmt_model(work: Path) -> Model | None:
    """OpenNMT-py's model in a compare_peers.py work folder, or None where it has none."""
    home = work / RUN_FOLDER
    checkpoints = {checkpoint_step(c): c for c in home.glob(CHECKPOINTS)}
    if not checkpoints:
        return None
    bin_dir = work / VENV / "bin"
    if not (bin_dir / "onmt_translate").is_file():
        raise NmtError(f"{work}: OpenNMT-py's checkpoints but no {bin_dir / 'onmt_translate'}")
    shared = shared_of(work)
    for needed in (shared.spm_model, shared.pieces / f"{VAL}.en"):
        if not needed.is_file():
            raise NmtError(f"{work}: no {needed}; expected a compare_peers.py --work folder")
    try:  # read before the first decoding, not after it
        spm.SentencePieceProcessor(model_file=str(shared.spm_model))
    except RuntimeError as e:
        raise NmtError(f"{shared.spm_model}: not a sentencepiece model ({e})") from None

    def decode(checkpoint: Path, out: Path) -> list[str]:
        sh(translate_command(bin_dir, shared, checkpoint, VAL, out, 1), env=decoding_env(own_env()))
        hyps = depiece(out, shared.spm_model)
        write_lines(out, hyps)  # its pieces joined, as nmt's file is
        return hyps

    return Model(REFERENCE, checkpoints, decode)


def models(args: argparse.Namespace) -> list[Model]:
    """OpenNMT-py's (where WORK has it), then each nmt run's, by label."""
    runs = sorted(p for p in args.work.glob("nmt-*") if p.is_dir()) + list(args.nmt)
    found = [nmt_model(run, args.data, args.precision) for run in runs]
    for model, run in zip(found, runs, strict=True):
        if not model.checkpoints:
            raise NmtError(f"{run}: no step-N.pt checkpoint; expected an nmt run folder")
    labels = [m.label for m in found]
    if len(set(labels)) < len(labels):
        raise NmtError(f"two nmt runs share a folder name ({', '.join(labels)}): name them apart")
    onmt = onmt_model(args.work)
    return ([onmt] if onmt else []) + found


def cell(hyps: list[str], refs: list[str], args: argparse.Namespace) -> str:
    c: Counts = count(hyps, refs, args.order, args.runaway)
    return f"{evaluate.bleu(hyps, refs).score:.1f}; {c.ratio:.3f}; {c.repeating}; {c.runaway}"


def wanted_steps(args: argparse.Namespace, found: list[Model]) -> list[int]:
    """--steps, else every update an nmt run kept; one line where no model has any."""
    nmt_kept = sorted({n for m in found if m.label != REFERENCE for n in m.checkpoints})
    steps = args.steps or nmt_kept
    if not steps:
        raise NmtError(f"{args.work}: no nmt run kept a step-N.pt checkpoint; give --steps")
    if not any(n in m.checkpoints for m in found for n in steps):
        asked = ", ".join(map(str, steps))
        raise NmtError(f"{args.work}: no model kept a checkpoint at update {asked}")
    return steps


def table(
    args: argparse.Namespace, found: list[Model], steps: list[int], out_dir: Path
) -> list[str]:
    refs = read_lines(args.data / f"{VAL}.fr")
    lines = [
        f"greedy on {VAL}: BLEU; length ratio; sentences repeating a {args.order}-gram; "
        f"over {args.runaway:g} x their reference + 2 words",
        "",
        "| model | " + " | ".join(f"{n:,}" for n in steps) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for model in found:
        cells = []
        for n in steps:
            checkpoint = model.checkpoints.get(n)
            if checkpoint is None:
                cells.append("")
                continue
            hyps = model.decode(checkpoint, out_dir / f"{model.label}.step-{n}.fr")
            if len(hyps) != len(refs):
                raise NmtError(f"{model.label} at update {n}: {len(hyps)} lines for {len(refs)}")
            cells.append(cell(hyps, refs, args))
            print(f"  {model.label} at update {n:,}: {cells[-1]}", file=sys.stderr, flush=True)
        lines.append(f"| {model.label} | " + " | ".join(cells) + " |")
    return lines


def arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="a compare_peers.py --work folder")
    ap.add_argument("--data", type=Path, required=True, help="the corpus folder (val.en, val.fr)")
    ap.add_argument("--nmt", type=Path, action="append", default=[], help="another nmt run")
    ap.add_argument("--steps", type=whole(1), nargs="+", help="the updates (nmt's kept ones)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    count_options(ap)
    ap.add_argument("--keep", type=Path, help="a new folder to keep the hypotheses in")
    args = ap.parse_args(argv)
    for name, path in (
        ("--work", args.work),
        ("--data", args.data),
        *(("--nmt", p) for p in args.nmt),
    ):
        if not path.is_dir():
            ap.error(f"{name} {path}: not a folder")
    if args.keep is not None and (args.keep.exists() or args.keep.is_symlink()):
        ap.error(f"--keep {args.keep}: already exists; expected a new folder")
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    with one_line():
        found = models(args)  # what is missing is said before any folder is made
        steps = wanted_steps(args, found)
        if args.keep is not None:
            args.keep.mkdir(parents=True)
            lines = table(args, found, steps, args.keep)
        else:
            with tempfile.TemporaryDirectory(prefix="checkpoint_repeats.") as tmp:
                lines = table(args, found, steps, Path(tmp))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
