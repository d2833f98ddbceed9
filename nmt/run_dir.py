"""The run directory: the names of what a run writes there, which of its entries are nmt's,
and `RunFiles`, which claims a directory for a run and saves its checkpoints into it
(last, best, the last k step checkpoints); `runs/latest`; finding the checkpoint a user
means. What a checkpoint holds is `nmt.checkpoint`'s business.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path
from typing import Any

from nmt.checkpoint import CheckpointError, save_checkpoint
from nmt.errors import NmtError
from nmt.files import atomic_write
from nmt.tokenizer import TOKENIZER_FILES

LATEST_LINK = Path("runs") / "latest"
# The checkpoints: the newest (what --resume continues), the best on validation, and the
# last `train.keep_last` of those written at validation (step-N.pt).
LAST_NAME = "last.pt"
BEST_NAME = "best.pt"
_STEP = "step-{}.pt"
METRICS_NAME = "metrics.jsonl"
# Files a finished or interrupted run leaves; their presence means "this run exists".
RUN_MARKERS = (LAST_NAME, BEST_NAME, METRICS_NAME)
# Written first into every run directory nmt makes or takes: the files named like a run's
# in a directory without it are the user's, never rewritten or deleted.
OWNER_MARK = ".nmt-run"
# The mean of the last checkpoints (`train.average_last`, or `nmt average -o` this name);
# a run directory translates with it first, then best.pt, then last.pt.
AVERAGED_NAME = "averaged.pt"
INFERENCE_ORDER = (AVERAGED_NAME, BEST_NAME, LAST_NAME)
# Everything nmt writes in a run directory, by name pattern; `--overwrite` deletes these and
# refuses a directory holding anything else. Folders list the patterns of their own entries.
RUN_FILES = (
    OWNER_MARK,
    *RUN_MARKERS,
    AVERAGED_NAME,
    "config.yaml",
    *TOKENIZER_FILES,
    _STEP.format("*"),
    ".*.tmp",  # an atomic write cut short
    ".*.link",  # a checkpoint link cut short
)
RUN_FOLDERS = {
    "tensorboard": ("events.out.tfevents.*",),
    "data": ("hf", "prepared-*", ".prepared-*"),  # datasets' copies and our tokenized cache
    "eval": ("*.hyp",),
}


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def run_entries(run_dir: Path) -> list[Path]:
    """The entries of `run_dir` that nmt wrote (by name: see RUN_FILES, RUN_FOLDERS)."""
    if not run_dir.is_dir():
        return []
    return sorted(
        p
        for p in run_dir.iterdir()
        if (p.is_dir() and p.name in RUN_FOLDERS)
        or (not p.is_dir() and _matches(p.name, RUN_FILES))
    )


def foreign_entries(run_dir: Path) -> list[Path]:
    """What in `run_dir` nmt did not write: anything at the top or in its own folders that
    does not match the names it uses."""
    foreign = []
    for p in sorted(run_dir.iterdir()):
        if p.is_dir() and not p.is_symlink() and p.name in RUN_FOLDERS:
            foreign += [q for q in sorted(p.iterdir()) if not _matches(q.name, RUN_FOLDERS[p.name])]
        elif p.is_dir() or not _matches(p.name, RUN_FILES):
            foreign.append(p)
    return foreign


def step_name(step: int) -> str:
    """The file name of the checkpoint saved at validation after update `step`."""
    return _STEP.format(step)


def step_of(path: Path) -> int | None:
    """The update a step-N.pt checkpoint was saved at; None for any other name."""
    head, _, tail = _STEP.partition("{}")
    middle = path.name.removeprefix(head).removesuffix(tail)
    named = path.name.startswith(head) and path.name.endswith(tail)
    return int(middle) if named and middle.isdigit() else None


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's step-N.pt checkpoints, oldest first."""
    found = [(n, p) for p in run_dir.glob(_STEP.format("*")) if (n := step_of(p)) is not None]
    return [p for _, p in sorted(found)]


def is_run_dir(path: Path) -> bool:
    """Whether a run wrote `path`: its OWNER_MARK, or (runs made before the mark) a
    checkpoint or metrics."""
    return any((path / name).exists() for name in (OWNER_MARK, *RUN_MARKERS))


def made_by_nmt(path: Path) -> bool:
    """Whether nmt made the directory `path` (its OWNER_MARK). Only there does a command
    write files the user did not name (nmt eval's hypotheses, its data cache): a checkpoint
    kept in a folder of the user's leaves that folder as it was."""
    return (path / OWNER_MARK).is_file()


def is_run_checkpoint_name(path: Path) -> bool:
    """Whether `path` is a name a run directory's training writes (last.pt, best.pt,
    step-N.pt) inside a run directory: an output there would replace a run's own file."""
    own = path.name in (LAST_NAME, BEST_NAME) or step_of(path) is not None
    return own and is_run_dir(path.parent)


def resolve_checkpoint(model: str | Path | None) -> Path:
    """Find the checkpoint a user means: a file, a run directory (its averaged, else best,
    else last checkpoint: INFERENCE_ORDER), or with nothing given the most recently trained
    run (`runs/latest`)."""
    if model is None:
        if LATEST_LINK.is_symlink() and not LATEST_LINK.exists():
            raise CheckpointError(
                f"no model given, and {LATEST_LINK} names {os.readlink(LATEST_LINK)}, which "
                "is gone: train one with `nmt train CONFIG` or pass --model RUN_DIR_OR_CHECKPOINT"
            )
        if not LATEST_LINK.exists():
            raise CheckpointError(
                "no model given and no trained run found (runs/latest): "
                "train one with `nmt train CONFIG` or pass --model RUN_DIR_OR_CHECKPOINT"
            )
        model = LATEST_LINK
    path = Path(model)
    if path.is_dir():
        for name in INFERENCE_ORDER:
            if (path / name).is_file():
                return path / name
        raise CheckpointError(
            f"{path}: run directory holds no {', '.join(INFERENCE_ORDER)} checkpoint"
        )
    if not os.path.lexists(path):  # (a broken link or a link loop: `load_checkpoint` says it)
        raise CheckpointError(f"{path}: no such run directory or checkpoint file")
    return path


def point_latest_at(run_dir: Path) -> str | None:
    """Make `runs/latest` a link to the run just trained (replaced atomically). Anything
    else at that name (a directory, a file: not a link nmt made) is left alone; returns
    why, for a warning, or None."""
    if LATEST_LINK.exists() and not LATEST_LINK.is_symlink():
        return f"{LATEST_LINK} is not a link nmt made; left as it is (it names no run)"
    tmp = LATEST_LINK.with_name(f".latest.{os.getpid()}")
    try:
        LATEST_LINK.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(run_dir.resolve(), LATEST_LINK.parent.resolve()))
        os.replace(tmp, LATEST_LINK)
    except OSError as e:
        return f"{LATEST_LINK}: not updated ({e.strerror or type(e).__name__})"
    finally:
        if tmp.is_symlink():
            tmp.unlink()
    return None


class RunFiles:
    """The run directory: what is in it, refusing to clobber or delete what is not ours, and
    keeping the last k step checkpoints."""

    def __init__(self, run_dir: Path, keep_last: int) -> None:
        self.dir = run_dir
        self.keep_last = keep_last

    def claim(self, *, resume: bool, overwrite: bool) -> None:
        """Make the directory ready for a run.

        `resume` on a run that wrote files but no checkpoint yet (killed in its first
        minutes) starts it again from the beginning. `overwrite` deletes the files of a
        previous run and nothing else: a directory holding anything nmt did not write is
        refused, untouched.
        """
        self._check_not_a_file()
        if resume:
            if not self.last.is_file() and not run_entries(self.dir):
                raise NmtError(
                    f"{self.dir}: nothing to resume (no run here); train without --resume"
                )
            self._check_owned()
            return
        self._check_owned()
        existing = [m for m in RUN_MARKERS if (self.dir / m).exists()]
        if existing and not overwrite:
            raise NmtError(
                f"{self.dir}: a run already exists here ({', '.join(existing)}); "
                "continue it with --resume, or start over with --overwrite"
            )
        if overwrite and self.dir.is_dir():
            foreign = foreign_entries(self.dir)
            if foreign:
                shown = ", ".join(str(p) for p in foreign[:3]) + (
                    " ..." if len(foreign) > 3 else ""
                )
                raise NmtError(
                    f"{self.dir}: --overwrite deletes only a run's own files, and this directory "
                    f"holds others ({shown}); nothing was deleted: choose another run.dir"
                )
            for entry in run_entries(self.dir):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        self._mark()

    def adopt(self) -> None:
        """Make the directory ours without starting a run (`nmt prepare`, whose tokenizer and
        cached data `nmt train` then reuses): refused where files named like a run's were not
        written by one, as `claim` refuses; made, and marked as nmt's, otherwise."""
        self._check_not_a_file()
        self._check_owned()
        if not (self.dir / OWNER_MARK).exists():
            self._mark()

    def _check_not_a_file(self) -> None:
        if self.dir.exists() and not self.dir.is_dir():
            raise NmtError(f"run.dir {self.dir}: is a file; expected a directory (or none)")

    def _mark(self) -> None:
        """The directory made (if need be) and marked as nmt's (OWNER_MARK)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / OWNER_MARK, b"a run directory of nmt train\n")

    def _check_owned(self) -> None:
        """Refuse a directory holding files named like a run's that no run wrote: no
        OWNER_MARK and no checkpoint or metrics (runs made before the mark have those).
        A user's own config.yaml kept in the experiment folder is never rewritten."""
        if not self.dir.is_dir() or is_run_dir(self.dir):
            return
        ours = [p for p in run_entries(self.dir) if p.name != OWNER_MARK]
        if ours:
            raise NmtError(
                f"{self.dir}: holds {ours[0].name}, named like a run's file but not written by "
                "a run (no .nmt-run here); nothing was changed: choose another run.dir or move it"
            )

    @property
    def last(self) -> Path:
        """The newest checkpoint: what --resume continues from."""
        return self.dir / LAST_NAME

    def save_last(self, state: dict[str, Any]) -> None:
        """Write last.pt atomically (between validations: no step or best checkpoint)."""
        save_checkpoint(state, self.last)

    def save(self, state: dict[str, Any], *, step: int, best: bool) -> None:
        """Write last.pt atomically; best.pt and step-N.pt are hard links to the same bytes
        (a later atomic replace of last.pt leaves them pointing at the old file)."""
        save_checkpoint(state, self.last)
        for name in [step_name(step)] + ([BEST_NAME] if best else []):
            self._link(self.last, self.dir / name)
        for old in step_checkpoints(self.dir)[: -self.keep_last]:
            old.unlink()

    @staticmethod
    def _link(src: Path, dst: Path) -> None:
        tmp = dst.with_name(f".{dst.name}.link")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:  # file systems without hard links
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
