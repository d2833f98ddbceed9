"""The attention study's reference word alignment (`scripts/attention_study.py`): eflomal, a
statistical word aligner, run once on the training corpus with the test set appended, in
both directions; their intersection gives the sure links, their union the possible ones.
eflomal is not one of nmt's dependencies: `pip install eflomal` (builds with gcc)."""

from __future__ import annotations

from pathlib import Path

from nmt.alignment import parse_links
from nmt.files import read_lines as lines


def eflomal_links(data: Path, out: Path, test: str) -> tuple[list[set], list[set]]:
    """Sure (both directions agree) and possible (either direction) links of the split `test`
    in the corpus folder `data`, from eflomal run on its training pairs with `test` appended,
    cached in `out`."""
    fwd, rev = out / "fwd", out / "rev"
    n_test = len(lines(data / f"{test}.en"))
    if not (fwd.is_file() and rev.is_file()):
        try:
            import eflomal
        except ImportError:
            raise SystemExit(
                "eflomal is needed for the alignment scores: pip install eflomal"
            ) from None
        out.mkdir(parents=True, exist_ok=True)
        # Words are what whitespace separates (as nmt.alignment merges pieces), lowercased.
        src = [s.lower() for s in lines(data / "train.en") + lines(data / f"{test}.en")]
        tgt = [t.lower() for t in lines(data / "train.fr") + lines(data / f"{test}.fr")]
        print(f"eflomal: aligning {len(src):,} pairs ...", flush=True)
        eflomal.Aligner(model=3).align(
            src, tgt, links_filename_fwd=str(fwd), links_filename_rev=str(rev)
        )
    f = [parse_links(x) for x in lines(fwd)[-n_test:]]
    r = [parse_links(x) for x in lines(rev)[-n_test:]]
    return [a & b for a, b in zip(f, r, strict=True)], [a | b for a, b in zip(f, r, strict=True)]
