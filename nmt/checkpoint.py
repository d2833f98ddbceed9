"""Checkpoints: atomic save, safe load, and rebuilding a model from a checkpoint alone.
(Where a run keeps them, and their names, is `nmt.run_dir`'s.)

A checkpoint is a dict of plain tensors, numbers, strings and bytes (never pickled
objects of ours), so `torch.load(weights_only=True)` reads it and a run directory copied
to another machine translates there. It holds everything to resume (model, optimizer,
scheduler, scaler, step, epoch, position in the data order, RNG states) and everything
to translate (resolved config, the tokenizer models themselves, vocabulary sizes).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nmt.config import Config, ConfigError, config_from_dict
from nmt.errors import NmtError
from nmt.files import Data, atomic_write, stands_in
from nmt.tokenizer import Tokenizer

if TYPE_CHECKING:
    from nmt.model import Seq2Seq

FORMAT_VERSION = 1


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
    there = stands_in(path)
    if there is not None:
        raise CheckpointError(
            f"{path}: {there}, not a checkpoint file: save the checkpoint to a file and give that"
        )
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


@dataclass
class Loaded:
    """A model ready to translate, rebuilt from a checkpoint alone."""

    config: Config
    tokenizer: Tokenizer
    model: Seq2Seq
    state: dict[str, Any]
    path: Path


def load_for_inference(path: Path, device: str | torch.device = "cpu") -> Loaded:
    """Rebuild config, tokenizer and model (in eval mode, on `device`) from a checkpoint file
    (`nmt.run_dir.resolve_checkpoint` finds the one a user means)."""
    from nmt.model import build_model
    from nmt.shortlist import Shortlist

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
    if isinstance(state.get("shortlist"), dict):  # checkpoints since the shortlist
        net.shortlist = Shortlist.from_state(state["shortlist"], device)
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
