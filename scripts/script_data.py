"""A config's data (and model) for a script, prepared without touching anything of the user's.

`nmt.data.prepare` writes the tokenizer and the tokenized splits' cache into the config's
run folder (`run.dir`, by default `runs/CONFIG_NAME`). A script that prepared there wrote into
whatever folder had that name: a folder of the user's gained nmt's files (and then, lacking
nmt's mark, refused the `nmt train` meant for it), or its own `spm.model` was read as the
tokenizer. So, as `nmt eval` does since session 37, a script uses the run folder only where
nmt made it (`nmt.run_dir.made_by_nmt`) and, given a checkpoint's tokenizer, that folder holds
the same one; then its cache is read (and written back where missing, as `nmt train` would).
Anywhere else the data is prepared in a temporary folder the caller gives, with the given
tokenizer written there first (else one trained there from the config).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import Config
from nmt.data import Prepared, prepare
from nmt.run_dir import made_by_nmt, resolve_checkpoint
from nmt.runtime import Precision
from nmt.tokenizer import Tokenizer, TokenizerError
from nmt.train_state import RESUME_KEYS, TrainState


def _holds(folder: Path, tokenizer: Tokenizer) -> bool:
    """Whether `folder` holds `tokenizer`, byte for byte."""
    try:
        return Tokenizer.load(folder).to_bytes() == tokenizer.to_bytes()
    except TokenizerError:  # none there
        return False


def prepared(cfg: Config, tmp: Path, tokenizer: Tokenizer | None = None) -> Prepared:
    """`cfg`'s data in `tokenizer`'s pieces (None: the run's own tokenizer, or one trained from
    the config): in the run folder where nmt made it and it holds that tokenizer, else in
    `tmp`, which must outlive the splits' use."""
    ours = made_by_nmt(cfg.run_dir)
    if not (ours and (tokenizer is None or _holds(cfg.run_dir, tokenizer))):
        if tokenizer is not None:
            tokenizer.write(tmp)
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(tmp)))
    return prepare(cfg, log=lambda _: None)


def trained(
    cfg: Config,
    config: str,
    checkpoint: Path | None,
    device: torch.device,
    precision: Precision,
    tmp: Path,
) -> tuple[TrainState, Prepared]:
    """`cfg`'s model and optimizer, a checkpoint's where given (a file, or a run directory as
    `--model` takes it), and its data (`prepared`) in the checkpoint's own pieces. `config`
    names the config in the one line that refuses another model's checkpoint."""
    path = resolve_checkpoint(checkpoint) if checkpoint and checkpoint.is_dir() else checkpoint
    state = load_checkpoint(path) if path else None
    tokenizer = None if state is None else Tokenizer.from_bytes(state["tokenizer"])
    data = prepared(cfg, tmp, tokenizer)
    ts = TrainState.build(cfg, data.tokenizer, device, precision, None)
    if state is not None:
        try:
            if all(k in state for k in RESUME_KEYS):  # a training's checkpoint
                ts.restore(state)
            else:  # weights alone (`nmt average`'s): Adam's state starts fresh
                ts.model.load_state_dict(state["model"])
        except (RuntimeError, KeyError) as e:  # load_state_dict: another model's weights
            first = str(e).splitlines()[0]
            raise SystemExit(f"error: {checkpoint}: not a model of {config} ({first})") from None
    return ts, data
