"""compare_peers.py's options of how the rows train (`--decay`, `--smoothing`) and decode (`--int8`,
`--decode-precision`, `--decode-workers`, ...) and whether they train first (`--redecode`),
and the check that they fit together and this machine; the check of the files it reads and
writes."""

from __future__ import annotations

import argparse
import math
from typing import NamedTuple

import argtypes
import torch
from work_folder import WorkFolder

from nmt.config import Config, load_config
from nmt.errors import NmtError
from nmt.files import check_output
from nmt.run_dir import OWNER_MARK
from nmt.runtime import cpu_has_bf16_matmul
from nmt.workers import check_workers
from peers.common import CONFIG


def decoding_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of how the rows decode and whether they train first."""
    again = ap.add_mutually_exclusive_group()  # OpenNMT-py's models again, or every row's
    again.add_argument(
        "--redecode-onmt",
        action="store_true",
        help="decode OpenNMT-py's checkpoints of the previous run again (no training); the "
        "other rows are kept from --out",
    )
    again.add_argument(
        "--redecode",
        action="store_true",
        help="decode every asked-for row's model of the previous run again (no training); "
        "training figures are kept from --out",
    )
    ap.add_argument(
        "--decode-repeats",
        type=argtypes.whole(1),
        default=1,
        help="run each decoding command N times (fresh processes, the rows in turns) and "
        "report the median",
    )
    ap.add_argument(
        "--int8",
        action="store_true",
        help="nmt's rows decode with int8 weights (nmt translate --int8; CPU only)",
    )
    ap.add_argument(
        "--decode-precision",
        choices=("fp32", "bf16"),
        help="nmt's rows decode in this precision (nmt translate --precision), whatever they "
        "trained in; bf16 lays the weights out for the CPU's bf16 matrix units",
    )
    ap.add_argument(
        "--decode-workers",
        type=argtypes.whole(1),
        default=1,
        metavar="N",
        help="nmt's rows decode in N worker processes of (cores / N) threads each (nmt "
        "translate --workers N; CPU only); the peers decode as they do",
    )


class Decay(NamedTuple):
    """`--decay START,EVERY,FACTOR`: both toolkits cut their learning rate by FACTOR at update
    START and every EVERY updates after it (OpenNMT-py's own decay; nmt's `schedule: step`)."""

    start: int
    every: int
    factor: float

    def nmt_set(self) -> list[str]:
        """The same schedule in nmt's keys, as --nmt-set overrides."""
        return [
            "train.schedule=step",
            f"train.decay_start={self.start}",
            f"train.decay_every={self.every}",
            f"train.decay_factor={self.factor}",
        ]

    def opennmt(self) -> dict[str, float]:
        """The same schedule in OpenNMT-py's options."""
        return {
            "start_decay_steps": self.start,
            "decay_steps": self.every,
            "learning_rate_decay": self.factor,
        }


def decay(text: str) -> Decay:
    """'800,100,0.5' -> Decay(800, 100, 0.5)."""
    parts = text.split(",")
    try:
        start, every = (argtypes.whole(1)(p) for p in parts[:2])
        factor = float(parts[2]) if len(parts) == 3 else math.nan
    except (argparse.ArgumentTypeError, ValueError):
        factor = math.nan
    if not 0.0 <= factor <= 1.0:  # nan too
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected START,EVERY,FACTOR: two whole numbers >= 1 and a factor in [0, 1]"
        )
    return Decay(start, every, factor)


def smoothing(text: str) -> float:
    """'1e-4' -> 0.0001: the weight of each update in the average, in (0, 1]."""
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not 0.0 < factor <= 1.0:  # nan too
        raise argparse.ArgumentTypeError(f"{text!r}: expected a factor in (0, 1], e.g. 1e-4")
    return factor


def training_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of how every row trains, beside the budget and the seed."""
    ap.add_argument(
        "--decay",
        type=decay,
        metavar="START,EVERY,FACTOR",
        help="every row cuts its learning rate by FACTOR at update START and every EVERY "
        "updates after (OpenNMT-py's start_decay_steps, decay_steps, learning_rate_decay; "
        "nmt's train.schedule=step); default: the reference's constant rate",
    )
    ap.add_argument(
        "--smoothing",
        type=smoothing,
        metavar="FACTOR",
        help="every row validates, saves and decodes a running average of its weights, each "
        "update weighing max(FACTOR, 9/(step + 10)) (OpenNMT-py's average_decay; nmt's "
        "train.exponential_smoothing); default: the weights as trained",
    )


# Each option: what it sets of nmt's config (the keys' beginnings), what that is, and how
# Joey NMT's row trains instead, which has no such option here.
_SETS = {
    "--decay": (
        ("train.schedule=", "train.decay_"),
        "the schedule",
        "at the reference's constant rate",
    ),
    "--smoothing": (("train.exponential_smoothing=",), "the average", "without a weight average"),
}


def check_training(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One `ap.error` where --decay or --smoothing cannot apply to every row asked for; else
    their settings join nmt's overrides."""
    for flag, (keys, what, joey) in _SETS.items():
        if getattr(args, flag[2:]) is None:
            continue
        if args.again:
            ap.error(f"{flag} and {args.again}: {args.again} trains nothing")
        if "joeynmt" in args.only:
            ap.error(f"{flag}: Joey NMT's row trains {joey}; leave it out of --only")
        if clash := [s for s in args.nmt_set if s.replace(" ", "").startswith(keys)]:
            ap.error(f"{flag} and --nmt-set {clash[0]}: {what} is set twice")
    if args.decay:
        args.nmt_set = [*args.nmt_set, *args.decay.nmt_set()]
    if args.smoothing:
        args.nmt_set = [*args.nmt_set, f"train.exponential_smoothing={args.smoothing}"]


def check_decoding(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One `ap.error` (a line, exit 2) where the decoding options contradict each other or
    this machine: first each other, which says the same on every machine."""
    if args.int8 and args.decode_precision:
        ap.error("--int8 and --decode-precision: int8 decoding keeps its float parts in fp32")
    gpu = torch.cuda.is_available()
    if args.int8 and gpu:
        ap.error("--int8: int8 decoding is for CPUs; this machine decodes on its GPU")
    if args.decode_precision == "bf16" and not gpu and not cpu_has_bf16_matmul():
        ap.error("--decode-precision bf16: this CPU has no bf16 matrix units (AVX512-BF16, AMX)")
    if args.decode_workers > 1 and gpu:
        ap.error("--decode-workers: worker processes decode on CPUs; this machine has a GPU")
    try:  # nmt translate's own check of the count (this machine's cores)
        check_workers(args.decode_workers, torch.device("cpu"), "--decode-workers")
    except NmtError as e:
        ap.error(str(e))


def check_files(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One `ap.error` (a line, exit 2) where --out or --plot would be written over what the
    run reads, --nmt-config or --nmt-set is not a config, or --work cannot be a folder: before
    an hour of training, not after it. Makes --work."""
    # what the run reads: an output written over one of them would lose it
    inputs = [(args.nmt_config, "--nmt-config"), (CONFIG, "the reference config")]
    inputs += [(f, "--data") for f in sorted(args.data.iterdir()) if f.is_file()]
    try:
        check_output(args.out, "--out", inputs)
        if args.plot:
            check_output(args.plot, "--plot", [*inputs, (args.out, "--out")])
        nmt_config(args)  # as every nmt row and the limit read it
        WORK.claim(args.work)
    except NmtError as e:
        ap.error(str(e))


# Only in a --work folder of its own does the script delete and remake the folders it keeps
# (a peer's run, the shared pieces). One filled before the mark holds a peer's finished
# virtualenv or nmt's pieces.
WORK = WorkFolder(
    "scripts/compare_peers.py",
    mark=".compare-peers-work",
    remakes="onmt-run, joey-run, spm-run, ...",
    earlier=("venv-onmt/.installed", "venv-joey/.installed", f"spm-run/{OWNER_MARK}"),
)


def nmt_config(args: argparse.Namespace) -> Config:
    """The config nmt's rows train (--nmt-config, --nmt-set) on --data."""
    return load_config(args.nmt_config, [f"data.dir={args.data}", *args.nmt_set])
