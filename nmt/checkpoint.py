"""Checkpoints: atomic save, safe load, and rebuilding a model from a checkpoint alone.

A checkpoint is a dict of plain tensors, numbers, strings and bytes (never pickled
objects of ours), so `torch.load(weights_only=True)` reads it and a run directory copied
to another machine translates there. It holds everything to resume (model, optimizer,
scheduler, scaler, step, epoch, position in the data order, RNG states) and everything
to translate (resolved config, the tokenizer models themselves, vocabulary sizes).
"""

from __future__ import annotations

import fnmatch
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nmt.config import Config, ConfigError, config_from_dict
from nmt.errors import NmtError
from nmt.files import Data, atomic_write
from nmt.tokenizer import TOKENIZER_FILES, Tokenizer

if TYPE_CHECKING:
    from nmt.model import Seq2Seq

FORMAT_VERSION = 1
LATEST_LINK = Path("runs") / "latest"
# Files a finished or interrupted run leaves; their presence means "this run exists".
RUN_MARKERS = ("last.pt", "best.pt", "metrics.jsonl")
# Written first into every run directory nmt makes or takes: the files named like a run's
# in a directory without it are the user's, never rewritten or deleted.
OWNER_MARK = ".nmt-run"
# The mean of the last checkpoints (`train.average_last`, or `nmt average -o` this name);
# a run directory translates with it first, then best.pt, then last.pt.
AVERAGED_NAME = "averaged.pt"
INFERENCE_ORDER = (AVERAGED_NAME, "best.pt", "last.pt")
# Everything nmt writes in a run directory, by name pattern; `--overwrite` deletes these and
# refuses a directory holding anything else. Folders list the patterns of their own entries.
RUN_FILES = (
    OWNER_MARK,
    *RUN_MARKERS,
    AVERAGED_NAME,
    "config.yaml",
    *TOKENIZER_FILES,
    "step-*.pt",
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


class CheckpointError(NmtError):
    """A checkpoint or run directory that cannot be used."""


def save_checkpoint(
    state: dict[str, Any], path: Path, *, write: Callable[[Path, Data], None] | None = None
) -> None:
    """Write `state` so that a crash, a kill or a full disk at any moment leaves the previous
    file intact (`nmt.files.atomic_write`; `write=write_output` for a file the user named)."""
    (write or atomic_write)(path, lambda f: torch.save({"format": FORMAT_VERSION, **state}, f))


def load_checkpoint(
    path: Path, map_location: str | torch.device = "cpu", *, mmap: bool = False
) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint`.

    `weights_only=True` unpickles plain data only: a file crafted to run code when loaded
    is refused before anything in it runs. `mmap` maps the tensors instead of reading them:
    what is never used (the optimizer's moments, to a translator) costs nothing.
    """
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # torch explains a refused global over many lines; its first line names it.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: refused: not plain checkpoint data ({first[:200]})"
        ) from None
    except Exception as e:  # truncated or foreign files end here
        reason = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        raise CheckpointError(
            f"{path}: not a readable nmt checkpoint (torch.load: {reason}); expected a .pt file "
            "written by nmt train"
        ) from None
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"{path}: not an nmt checkpoint (no format version in it)")
    if state["format"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {state['format']!r}, but this nmt reads format "
            f"{FORMAT_VERSION}: use the nmt version that wrote it"
        )
    return state


def resolve_checkpoint(model: str | Path | None) -> Path:
    """Find the checkpoint a user means: a file, a run directory (its averaged, else best,
    else last checkpoint: INFERENCE_ORDER), or with nothing given the most recently trained
    run (`runs/latest`)."""
    if model is None:
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
    if not path.exists():
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


@dataclass
class Loaded:
    """A model ready to translate, rebuilt from a checkpoint alone."""

    config: Config
    tokenizer: Tokenizer
    model: Seq2Seq
    state: dict[str, Any]
    path: Path


def load_for_inference(model: str | Path | None, device: str | torch.device = "cpu") -> Loaded:
    """Rebuild config, tokenizer and model (in eval mode, on `device`) from a checkpoint."""
    from nmt.model import build_model

    path = resolve_checkpoint(model)
    state = load_checkpoint(path, mmap=True)
    check_model_state(state, path)
    try:
        cfg = config_from_dict(state["config"], source=str(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: its config no longer validates ({e})") from None
    try:
        tokenizer = Tokenizer.from_bytes(state["tokenizer"])
    except Exception as e:  # sentencepiece's own errors: not ours to list
        raise CheckpointError(
            f"{path}: its tokenizer cannot be read ({type(e).__name__})"
        ) from None
    net = build_model(
        cfg.model,
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        shared_vocab=tokenizer.joint,
        initialise=False,  # every weight is loaded next
    )
    load_weights(net, state["model"], path)
    net.to(device).eval()
    return Loaded(config=cfg, tokenizer=tokenizer, model=net, state=state, path=path)


def check_model_state(state: dict[str, Any], path: Path) -> None:
    """What every model checkpoint holds, of the right kinds: a config mapping, a tokenizer
    and a mapping of weight tensors (for translating and averaging alike)."""
    missing = [k for k in ("config", "tokenizer", "model") if k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a model checkpoint (no {', '.join(missing)} in it)")
    if not isinstance(state["config"], dict):
        raise CheckpointError(f"{path}: its config is not a mapping of sections")
    weights = state["model"]
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise CheckpointError(f"{path}: its weights are not a mapping of tensors")


def load_weights(net: torch.nn.Module, weights: dict[str, Tensor], path: Path) -> None:
    """`net.load_state_dict(weights)`, strict; weights that do not fit the model (missing,
    extra, wrongly shaped: a file edited or mixed up) are one line naming the first."""
    own = net.state_dict()
    missing = [k for k in own if k not in weights]
    extra = [k for k in weights if k not in own]
    shaped = [k for k in own if k in weights and weights[k].shape != own[k].shape]
    for what, keys in (("lacks", missing), ("has unknown", extra)):
        if keys:
            raise CheckpointError(
                f"{path}: its weights do not fit its config: {what} {keys[0]}"
                + (f" and {len(keys) - 1} more" if len(keys) > 1 else "")
            )
    if shaped:
        k = shaped[0]
        raise CheckpointError(
            f"{path}: its weights do not fit its config: {k} is {tuple(weights[k].shape)}, "
            f"the model needs {tuple(own[k].shape)}"
        )
    net.load_state_dict(weights)


def is_run_dir(path: Path) -> bool:
    """Whether a run wrote `path`: its OWNER_MARK, or (runs made before the mark) a
    checkpoint or metrics."""
    return any((path / name).exists() for name in (OWNER_MARK, *RUN_MARKERS))


def is_run_checkpoint_name(path: Path) -> bool:
    """Whether `path` is a name a run directory's training writes (last.pt, best.pt,
    step-N.pt) inside a run directory: an output there would replace a run's own file."""
    own = path.name in ("last.pt", "best.pt") or fnmatch.fnmatchcase(path.name, "step-*.pt")
    return own and is_run_dir(path.parent)


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
        if self.dir.exists() and not self.dir.is_dir():
            raise NmtError(f"run.dir {self.dir}: is a file; expected a directory (or none)")
        if resume:
            if not (self.dir / "last.pt").is_file() and not run_entries(self.dir):
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

    def save(self, state: dict[str, Any], *, step: int, best: bool) -> None:
        """Write last.pt atomically; best.pt and step-N.pt are hard links to the same bytes
        (a later atomic replace of last.pt leaves them pointing at the old file)."""
        last = self.dir / "last.pt"
        save_checkpoint(state, last)
        for name in [f"step-{step}.pt"] + (["best.pt"] if best else []):
            self._link(last, self.dir / name)
        steps = sorted(self.dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
        for old in steps[: -self.keep_last]:
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
