"""Give a checkpoint trained before the vocabulary shortlist one: the table is built from
its run's own training data (the config stored in the checkpoint; the run's cached splits
when they are still there) and written with the checkpoint to a new file. The run's own
files are never rewritten.

    NMT_DATA_DIR=../shared/data .venv/bin/python scripts/add_shortlist.py \
        runs/general_en_fr/best.pt /tmp/with_shortlist.pt
    nmt eval -m /tmp/with_shortlist.pt --src val.en --ref val.fr               # shortlist
    nmt eval -m /tmp/with_shortlist.pt --src val.en --ref val.fr --full-vocab  # without
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from argtypes import whole

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.config import apply_data_dir_env, config_from_dict
from nmt.data import prepare
from nmt.errors import one_line
from nmt.files import check_output, write_output
from nmt.shortlist import FREQUENT, PER_SOURCE, build_for


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
    prepared = prepare(cfg, log=lambda _: None)
    started = time.perf_counter()
    table = build_for(
        prepared.tokenizer,
        prepared.train.src_ids,
        prepared.train.tgt_ids,
        per_source=args.per_source,
        frequent=args.frequent,
    )
    print(f"shortlist built in {time.perf_counter() - started:.1f} s")
    save_checkpoint({**state, "shortlist": table.to_state()}, args.out, write=write_output)
    print(f"written: {args.out}")


if __name__ == "__main__":
    with one_line():  # nothing was written
        main()
