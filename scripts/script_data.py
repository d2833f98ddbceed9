"""A config's data, prepared for a script without touching anything of the user's.

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

from nmt.config import Config
from nmt.data import Prepared, prepare
from nmt.run_dir import made_by_nmt
from nmt.tokenizer import Tokenizer, TokenizerError


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
