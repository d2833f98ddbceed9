"""Checkpoints: atomic save, safe load, and rebuilding a model from a checkpoint alone.

A checkpoint is a dict of plain tensors, numbers, strings and bytes (never pickled
objects of ours), so `torch.load(weights_only=True)` reads it and a run directory copied
to another machine translates there. It holds everything to resume (model, optimizer,
scheduler, scaler, step, epoch, position in the data order, RNG states) and everything
to translate (resolved config, the tokenizer models themselves, vocabulary sizes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nmt.config import Config, ConfigError, config_from_dict
from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.model import Seq2Seq
    from nmt.tokenizer import Tokenizer

FORMAT_VERSION = 1
LATEST_LINK = Path("runs") / "latest"
# Files a finished or interrupted run leaves; their presence means "this run exists".
RUN_MARKERS = ("last.pt", "best.pt", "metrics.jsonl")


class CheckpointError(NmtError):
    """A checkpoint or run directory that cannot be used."""


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` so that a crash at any moment leaves the previous file intact.

    The bytes go to a temporary file in the same directory, are fsynced, and then the
    file is renamed over `path` (rename is atomic on POSIX), and the directory is fsynced
    so the rename itself survives a power cut.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a checkpoint is an ordinary file
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (plain data only: weights_only=True)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # corrupt, truncated or foreign files all end here
        raise CheckpointError(f"{path}: not a readable nmt checkpoint ({e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not an nmt checkpoint of format {FORMAT_VERSION}")
    return state


def resolve_checkpoint(model: str | Path | None) -> Path:
    """Find the checkpoint a user means: a file, a run directory (its best, else last), or
    with nothing given the most recently trained run (`runs/latest`)."""
    if model is None:
        if not LATEST_LINK.exists():
            raise CheckpointError(
                "no model given and no trained run found (runs/latest): "
                "train one with `nmt train CONFIG` or pass --model RUN_DIR_OR_CHECKPOINT"
            )
        model = LATEST_LINK
    path = Path(model)
    if path.is_dir():
        for name in ("best.pt", "last.pt"):
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path}: run directory holds no best.pt or last.pt checkpoint")
    if not path.exists():
        raise CheckpointError(f"{path}: no such run directory or checkpoint file")
    return path


def point_latest_at(run_dir: Path) -> None:
    """Make `runs/latest` a link to the run just trained (replaced atomically)."""
    LATEST_LINK.parent.mkdir(parents=True, exist_ok=True)
    tmp = LATEST_LINK.with_name(f".latest.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(run_dir.resolve(), LATEST_LINK.parent.resolve()))
    os.replace(tmp, LATEST_LINK)


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
    from nmt.tokenizer import Tokenizer

    path = resolve_checkpoint(model)
    state = load_checkpoint(path)
    try:
        cfg = config_from_dict(state["config"], source=str(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: its config no longer validates ({e})") from None
    tokenizer = Tokenizer.from_bytes(state["tokenizer"])
    net = build_model(
        cfg.model,
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        shared_vocab=tokenizer.joint,
    )
    net.load_state_dict(state["model"])
    net.to(device).eval()
    return Loaded(config=cfg, tokenizer=tokenizer, model=net, state=state, path=path)


class RunFiles:
    """The run directory: refuses to clobber a finished run, keeps the last k checkpoints."""

    def __init__(self, run_dir: Path, keep_last: int) -> None:
        self.dir = run_dir
        self.keep_last = keep_last

    def claim(self, *, resume: bool, overwrite: bool) -> None:
        existing = [m for m in RUN_MARKERS if (self.dir / m).exists()]
        if resume:
            if not (self.dir / "last.pt").is_file():
                raise NmtError(
                    f"{self.dir}: nothing to resume (no last.pt); train without --resume"
                )
            return
        if existing and not overwrite:
            raise NmtError(
                f"{self.dir}: a run already exists here ({', '.join(existing)}); "
                "continue it with --resume, or start over with --overwrite"
            )
        if overwrite and self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)

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
