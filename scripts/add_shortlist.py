"""Give a checkpoint trained before the vocabulary shortlist one: the table is built from
its run's own training data (the config stored in the checkpoint) in the checkpoint's own
pieces, and written with the checkpoint to a new file. The run's cached splits are read
where its folder, one nmt made, still holds the checkpoint's tokenizer (a cache missing
there is written back, as `nmt train` would); otherwise (the folder gone, another run's, or
relative to another working directory) the data is tokenized afresh in a temporary folder.
Nothing else is written but OUT.

    NMT_DATA_DIR=../shared/data .venv/bin/python scripts/add_shortlist.py \
        runs/general_en_fr/best.pt /tmp/with_shortlist.pt
    nmt eval -m /tmp/with_shortlist.pt --src val.en --ref val.fr               # shortlist
    nmt eval -m /tmp/with_shortlist.pt --src val.en --ref val.fr --full-vocab  # without
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from argtypes import whole
from script_data import prepared

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.config import apply_data_dir_env, config_from_dict
from nmt.errors import one_line
from nmt.files import check_output, write_output
from nmt.shortlist import FREQUENT, PER_SOURCE, build_for
from nmt.tokenizer import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--per-source", type=whole(1), default=PER_SOURCE)
    ap.add_argument("--frequent", type=whole(0), default=FREQUENT)
    args = ap.parse_args()
    check_output(args.out, "OUT", [(args.checkpoint, "CHECKPOINT")])
    state = load_checkpoint(args.checkpoint)
    cfg = config_from_dict(apply_data_dir_env(state["config"]))
    tokenizer = Tokenizer.from_bytes(state["tokenizer"])
    with tempfile.TemporaryDirectory(prefix="add_shortlist.") as tmp:
        train = prepared(cfg, Path(tmp), tokenizer).train
        started = time.perf_counter()
        table = build_for(
            tokenizer, train.src_ids, train.tgt_ids, per_source=args.per_source,
            frequent=args.frequent,
        )  # fmt: skip
    print(f"shortlist built in {time.perf_counter() - started:.1f} s")
    save_checkpoint({**state, "shortlist": table.to_state()}, args.out, write=write_output)
    print(f"written: {args.out}")


if __name__ == "__main__":
    with one_line():  # nothing was written
        main()
