"""Parallel corpora: loading any source a config names through `datasets`.

Loading gives a `datasets.Dataset` with text columns `src` and `tgt` for aligned text
files, TSV, JSON lines or the Hugging Face hub, local paths or URLs; Multi30k is
downloaded when asked (`nmt.download`). Failures are one-line `DataError`s
naming the file and what was expected. Tokenizing and caching are in `nmt.data`.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from nmt.config import DATA_DIR_ENV, CorpusConfig, DataConfig
from nmt.download import download_multi30k, download_tatoeba
from nmt.errors import DataError
from nmt.files import stands_in

# Library calls must not draw progress bars or log into the user's terminal.
datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()

_HOLDOUT_SEED = 1234  # held-out valid/test rows must not move when train.seed changes
TEXT = datasets.Value("string")  # the feature type of the src and tgt columns


def load_split(
    d: DataConfig,
    split: str,
    *,
    corpus: CorpusConfig | None = None,
    cache_dir: Path | None = None,
) -> datasets.Dataset:
    """One split of a corpus (by default the config's first) as a Dataset with text columns
    `src` and `tgt`. `cache_dir` is where `datasets` keeps its Arrow copies (default: its
    own home cache).
    """
    c = corpus or d.corpus_list()[0]
    if c.format == "text":
        ds = _load_text(d, c, split, cache_dir)
    elif c.format == "tsv":
        where = _locate(d, c, split)
        ds = _load_builder(
            "csv",
            where,
            cache_dir,
            delimiter="\t",
            quoting=csv.QUOTE_NONE,
            header=None,
            column_names=["src", "tgt"],
            usecols=[0, 1],  # Tatoeba-style attribution columns are ignored
            keep_default_na=False,  # "NA" and "null" are sentences, not missing values
            na_filter=False,
            features=datasets.Features({"src": TEXT, "tgt": TEXT}),
        )
    elif c.format == "jsonl":
        where = _locate(d, c, split)
        ds = _pairs_from_rows(_load_builder("json", where, cache_dir), d, c, where)
    else:
        where = f"{c.hub_name} ({split})"
        try:
            rows = datasets.load_dataset(
                c.hub_name, c.hub_config, split=split, cache_dir=_str(cache_dir)
            )
        except (datasets.exceptions.DatasetsError, OSError, ValueError) as e:
            raise DataError(f"{where}: cannot load from the Hugging Face hub ({e})") from None
        ds = _pairs_from_rows(rows, d, c, where)
    if d.lowercase:
        ds = ds.map(_lowercase, batched=True)
    return ds


def extract_pairs(
    rows: dict[str, list[Any]],
    cfg: DataConfig,
    *,
    where: str,
    first_row: int = 0,
    corpus: CorpusConfig | None = None,
) -> dict[str, list[str]]:
    """The `src`/`tgt` texts of a batch of JSON or hub rows.

    A row gives its sides either as the fields `cfg.src_field` and `cfg.tgt_field`, or as a
    `translation` dict keyed by language ({cfg.src_lang: ..., cfg.tgt_lang: ...}), the
    layout of WMT and OPUS datasets on the hub. Rows are numbered from `first_row` + 1 in
    errors.
    """
    c = corpus or cfg.corpus_list()[0]
    n = len(next(iter(rows.values()))) if rows else 0
    none: list[Any] = [None] * n
    flat_src = rows.get(c.src_field, none)
    flat_tgt = rows.get(c.tgt_field, none)
    translation = rows.get("translation", none)
    src: list[str] = []
    tgt: list[str] = []
    for i in range(n):
        s, t = flat_src[i], flat_tgt[i]
        pair = translation[i]
        if (s is None or t is None) and isinstance(pair, dict):
            s, t = pair.get(cfg.src_lang), pair.get(cfg.tgt_lang)
        if s is None or t is None:
            raise DataError(
                f"{where}: row {first_row + i + 1} has neither the fields '{c.src_field}' and "
                f"'{c.tgt_field}' (src_field/tgt_field) nor a 'translation' dict with "
                f"'{cfg.src_lang}' and '{cfg.tgt_lang}' (data.src_lang/tgt_lang); "
                f"its fields: {', '.join(k for k in rows if rows[k][i] is not None)}"
            )
        src.append(str(s))
        tgt.append(str(t))
    return {"src": src, "tgt": tgt}


def _pairs_from_rows(
    rows: datasets.Dataset, d: DataConfig, c: CorpusConfig, where: str
) -> datasets.Dataset:
    def fn(batch: dict[str, list[Any]], idx: list[int]) -> dict[str, list[str]]:
        return extract_pairs(batch, d, where=where, first_row=idx[0] if idx else 0, corpus=c)

    return rows.map(fn, batched=True, with_indices=True, remove_columns=rows.column_names)


def _lowercase(batch: dict[str, list[str]]) -> dict[str, list[str]]:
    return {"src": [s.lower() for s in batch["src"]], "tgt": [t.lower() for t in batch["tgt"]]}


def _load_text(
    d: DataConfig, c: CorpusConfig, split: str, cache_dir: Path | None
) -> datasets.Dataset:
    """Two aligned files, `{dir}/{split}.{src_lang}` and `{dir}/{split}.{tgt_lang}`."""
    paths = [Path(c.dir) / f"{split}.{lang}" for lang in (d.src_lang, d.tgt_lang)]
    for path in paths:
        _check_not_stood_in(path, f"the '{split}' split's file")
    missing = [p for p in paths if not p.is_file()]
    if missing:
        _check_root(d, c, [p.name for p in paths])
    if missing and c.download == "multi30k":
        download_multi30k(missing)
    elif missing:
        raise DataError(
            f"{missing[0]}: no such file; put the '{split}' split{_of(d, c)} in {c.dir} as "
            f"{paths[0].name} and {paths[1].name}, one sentence a line "
            f"(for Multi30k, {d.key_of(c)}.download: multi30k fetches them)"
        )
    # The text builder keeps empty lines as empty rows, so line N stays row N on both sides.
    src, tgt = (_load_builder("text", str(p), cache_dir, keep_linebreaks=False) for p in paths)
    if len(src) != len(tgt):
        raise DataError(
            f"{paths[0]} has {len(src)} lines but {paths[1]} has {len(tgt)}: "
            "the two sides must be aligned line by line"
        )
    return datasets.concatenate_datasets(
        [src.rename_column("text", "src"), tgt.rename_column("text", "tgt")], axis=1
    )


def _check_not_stood_in(path: Path, what: str) -> None:
    """A folder, a pipe or a broken link where `what` (a split's file) goes is the user's:
    said in one line, neither read nor replaced by a download."""
    there = stands_in(path)
    if there is not None:
        raise DataError(
            f"{path}: {there} where {what} should be; nmt neither reads nor replaces it: "
            "put the split there as a file"
        )


def _check_root(d: DataConfig, c: CorpusConfig, names: Sequence[str]) -> None:
    """A corpus folder that is missing because the data root moved: say what changed.

    NMT_DATA_DIR (data.root) names the folder that holds one folder per corpus; it used to
    name the corpus folder itself, and `data.dir` is now relative to the root."""
    if Path(c.dir).is_dir():
        return
    root = Path(d.root)
    if all((root / n).is_file() for n in names):
        raise DataError(
            f"{c.dir}: no such folder, but the data root {root} itself holds corpus "
            f"'{c.name}' ({', '.join(names)}). NMT_DATA_DIR / data.root now names the folder "
            f"that holds one folder per corpus: use {DATA_DIR_ENV}={root.parent}"
        )
    if ".." in Path(c.dir).parts:
        raise DataError(
            f"{c.dir}: no such folder. A corpus folder (data.dir) is relative to the data "
            f"root data.root ({d.root}; {DATA_DIR_ENV} sets it): give the root instead, "
            f"e.g. --set data.root=..., or an absolute folder"
        )


def _locate(d: DataConfig, c: CorpusConfig, split: str) -> str:
    """A tsv/jsonl split names a URL, an absolute path, or a path relative to the corpus
    folder."""
    if split.startswith(("http://", "https://")):
        return split
    path = Path(split) if Path(split).is_absolute() else Path(c.dir) / split
    _check_not_stood_in(path, f"{d.key_of(c)}'s split file {split}")
    if path.is_file():
        return str(path)
    _check_root(d, c, [split])
    if c.download == "tatoeba" and c.format == "tsv":
        download_tatoeba(path, d.tgt_lang if d.src_lang == "en" else d.src_lang, d.key_of(c))
    else:
        raise DataError(
            f"{path}: no such file ({d.key_of(c)}.format {c.format}: a split names a file "
            f"relative to the corpus folder {c.dir}, an absolute path or an http(s) URL)"
        )
    return str(path)


def _load_builder(
    builder: str, where: str, cache_dir: Path | None, **options: Any
) -> datasets.Dataset:
    """`datasets.load_dataset` on one file or URL, its failures turned into a DataError."""
    try:
        return datasets.load_dataset(
            builder, data_files=where, split="train", cache_dir=_str(cache_dir), **options
        )
    except (datasets.exceptions.DatasetsError, OSError, ValueError) as e:
        raise DataError(_read_error(where, builder, e)) from None


def _read_error(where: str, builder: str, error: BaseException) -> str:
    """A one-line description of why a file could not be read, with the line for bad UTF-8."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, UnicodeDecodeError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None and Path(where).is_file():
        with open(where, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as bad:
                    return (
                        f"{where}: line {number} is not valid UTF-8 (byte "
                        f"{line[bad.start]:#04x} at column {bad.start + 1}); save the file as UTF-8"
                    )
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    kind = {"text": "text", "csv": "TSV", "json": "JSON lines"}.get(builder, builder)
    return f"{where}: cannot read as {kind} ({type(root).__name__}: {root})".replace("\n", " ")


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


@dataclass
class RawSplit:
    """One split as loaded, before tokenizing: role train, valid or test."""

    role: str
    name: str  # the split's name; with several corpora, prefixed "corpus/"
    texts: datasets.Dataset
    total: int  # rows read (train: before duplicates were removed)
    removed: dict[str, int] = field(default_factory=dict)  # reason -> training pairs
    weight: float = 1.0
    invented: int = 0  # copies with invented names added (nmt.augment), train only


DUPLICATE = "duplicates"
HELD_OUT = "with a source in a valid/test set"


def load_splits(d: DataConfig, *, cache_dir: Path | None = None) -> list[RawSplit]:
    """Every split of every corpus a config names: the train splits first (one per corpus,
    in config order), then the valid splits, then the test splits.

    With `valid: ""` (or `test: []`) and `valid_size` (`test_size`) rows, those rows are held
    out of the corpus's train split, a sample fixed by a constant seed. With `data.dedup`,
    exact duplicate training pairs are removed (the first kept), and training pairs whose
    source is in a valid or test split.
    """
    corpora = d.corpus_list()
    trains, valids, tests = [], [], []
    for c in corpora:
        train = load_split(d, c.train, corpus=c, cache_dir=cache_dir)
        held: dict[str, datasets.Dataset] = {}
        for role, split, size in (("valid", c.valid, c.valid_size), ("test", c.test, c.test_size)):
            if split or not size:
                continue
            if size >= len(train):
                raise DataError(
                    f"{d.key_of(c)}.{role}_size: {size} rows asked for but the train split "
                    f"'{c.train}'{_of(d, c)} has only {len(train)}"
                )
            parts = train.train_test_split(test_size=size, shuffle=True, seed=_HOLDOUT_SEED)
            train, held[role] = parts["train"], parts["test"]
        trains.append(
            RawSplit("train", split_name(d, c, c.train), train, len(train), weight=c.weight)
        )
        if "valid" in held:
            valids.append(
                RawSplit("valid", split_name(d, c, "valid"), held["valid"], len(held["valid"]))
            )
        elif c.valid:
            ds = load_split(d, c.valid, corpus=c, cache_dir=cache_dir)
            valids.append(RawSplit("valid", split_name(d, c, c.valid), ds, len(ds)))
        for split in c.test:
            ds = load_split(d, split, corpus=c, cache_dir=cache_dir)
            tests.append(RawSplit("test", split_name(d, c, split), ds, len(ds)))
        if "test" in held:
            tests.append(
                RawSplit("test", split_name(d, c, "test"), held["test"], len(held["test"]))
            )
    if not valids:
        raise DataError(
            "data.valid: no corpus names a validation split; name one, or set valid_size "
            "to hold rows of a train split out for validation"
        )
    if d.dedup:
        _dedup(trains, [*valids, *tests])
    return [*trains, *valids, *tests]


def _of(d: DataConfig, c: CorpusConfig) -> str:
    """ " of corpus 'name'" in messages where the config has several."""
    return "" if not d.corpora else f" of corpus '{c.name}'"


def split_name(d: DataConfig, c: CorpusConfig, split: str) -> str:
    """A split's name in reports and metrics: its own with one corpus, else `corpus/split`."""
    return split if d.single else f"{c.name}/{split}"


def _dedup(trains: list[RawSplit], held_out: list[RawSplit]) -> None:
    """Remove from the train splits exact duplicate pairs (across and within corpora, the
    first kept) and pairs whose source sentence is in a held-out split; count both."""
    held_src = {s.strip() for h in held_out for s in h.texts["src"][:]} - {""}
    seen: set[tuple[str, str]] = set()
    for t in trains:
        keep: list[int] = []
        removed = {DUPLICATE: 0, HELD_OUT: 0}
        for i, (s, g) in enumerate(zip(t.texts["src"][:], t.texts["tgt"][:], strict=True)):
            pair = (s.strip(), g.strip())
            if not pair[0] or not pair[1]:  # left to the cleaning that drops empty sides
                keep.append(i)
            elif pair[0] in held_src:
                removed[HELD_OUT] += 1
            elif pair in seen:
                removed[DUPLICATE] += 1
            else:
                seen.add(pair)
                keep.append(i)
        if len(keep) < len(t.texts):
            t.texts = t.texts.select(keep)
        t.removed = removed
