"""Parallel corpora: loading any source a config names through `datasets`.

Loading gives a `datasets.Dataset` with text columns `src` and `tgt` for aligned text
files, TSV, JSON lines or the Hugging Face hub, local paths or URLs; Multi30k is
downloaded from its public repository when asked. Failures are one-line `DataError`s
naming the file and what was expected. Tokenizing and caching are in `nmt.data`.
"""

from __future__ import annotations

import csv
import gzip
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from nmt.config import DataConfig
from nmt.errors import NmtError
from nmt.files import FileError, atomic_write

# Library calls must not draw progress bars or log into the user's terminal.
datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}.gz"
_HOLDOUT_SEED = 1234  # held-out valid/test rows must not move when train.seed changes
TEXT = datasets.Value("string")  # the feature type of the src and tgt columns


class DataError(NmtError):
    """A corpus that cannot be read or does not have the expected layout."""


def load_split(cfg: DataConfig, split: str, *, cache_dir: Path | None = None) -> datasets.Dataset:
    """One split of the corpus as a Dataset with text columns `src` and `tgt`.

    `cache_dir` is where `datasets` keeps its Arrow copies (default: its own home cache).
    """
    if cfg.format == "text":
        ds = _load_text(cfg, split, cache_dir)
    elif cfg.format == "tsv":
        where = _locate(cfg, split)
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
    elif cfg.format == "jsonl":
        where = _locate(cfg, split)
        ds = _pairs_from_rows(_load_builder("json", where, cache_dir), cfg, where)
    else:
        where = f"{cfg.hub_name} ({split})"
        try:
            rows = datasets.load_dataset(
                cfg.hub_name, cfg.hub_config, split=split, cache_dir=_str(cache_dir)
            )
        except (datasets.exceptions.DatasetsError, OSError, ValueError) as e:
            raise DataError(f"{where}: cannot load from the Hugging Face hub ({e})") from None
        ds = _pairs_from_rows(rows, cfg, where)
    if cfg.lowercase:
        ds = ds.map(_lowercase, batched=True)
    return ds


def extract_pairs(
    rows: dict[str, list[Any]], cfg: DataConfig, *, where: str, first_row: int = 0
) -> dict[str, list[str]]:
    """The `src`/`tgt` texts of a batch of JSON or hub rows.

    A row gives its sides either as the fields `cfg.src_field` and `cfg.tgt_field`, or as a
    `translation` dict keyed by language ({cfg.src_lang: ..., cfg.tgt_lang: ...}), the
    layout of WMT and OPUS datasets on the hub. Rows are numbered from `first_row` + 1 in
    errors.
    """
    n = len(next(iter(rows.values()))) if rows else 0
    none: list[Any] = [None] * n
    flat_src = rows.get(cfg.src_field, none)
    flat_tgt = rows.get(cfg.tgt_field, none)
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
                f"{where}: row {first_row + i + 1} has neither the fields '{cfg.src_field}' and "
                f"'{cfg.tgt_field}' (data.src_field/tgt_field) nor a 'translation' dict with "
                f"'{cfg.src_lang}' and '{cfg.tgt_lang}' (data.src_lang/tgt_lang); "
                f"its fields: {', '.join(k for k in rows if rows[k][i] is not None)}"
            )
        src.append(str(s))
        tgt.append(str(t))
    return {"src": src, "tgt": tgt}


def _pairs_from_rows(rows: datasets.Dataset, cfg: DataConfig, where: str) -> datasets.Dataset:
    def fn(batch: dict[str, list[Any]], idx: list[int]) -> dict[str, list[str]]:
        return extract_pairs(batch, cfg, where=where, first_row=idx[0] if idx else 0)

    return rows.map(fn, batched=True, with_indices=True, remove_columns=rows.column_names)


def _lowercase(batch: dict[str, list[str]]) -> dict[str, list[str]]:
    return {"src": [s.lower() for s in batch["src"]], "tgt": [t.lower() for t in batch["tgt"]]}


def _load_text(cfg: DataConfig, split: str, cache_dir: Path | None) -> datasets.Dataset:
    """Two aligned files, `{dir}/{split}.{src_lang}` and `{dir}/{split}.{tgt_lang}`."""
    paths = [Path(cfg.dir) / f"{split}.{lang}" for lang in (cfg.src_lang, cfg.tgt_lang)]
    missing = [p for p in paths if not p.is_file()]
    if missing and cfg.download == "multi30k":
        download_multi30k(missing)
    elif missing:
        raise DataError(
            f"{missing[0]}: no such file; put the '{split}' split in {cfg.dir} as "
            f"{paths[0].name} and {paths[1].name}, one sentence a line "
            "(for Multi30k, data.download: multi30k fetches them)"
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


def _locate(cfg: DataConfig, split: str) -> str:
    """A tsv/jsonl split names a URL, an absolute path, or a path relative to data.dir."""
    if split.startswith(("http://", "https://")):
        return split
    path = Path(split) if Path(split).is_absolute() else Path(cfg.dir) / split
    if not path.is_file():
        raise DataError(
            f"{path}: no such file (data.format {cfg.format}: a split names a file relative "
            f"to data.dir {cfg.dir}, an absolute path or an http(s) URL)"
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


def download_multi30k(paths: Sequence[Path]) -> None:
    """Fetch Multi30k files (`{split}.{lang}`) from the dataset's public repository.

    Each file is written atomically, so an interrupted download never leaves a truncated
    corpus behind.
    """
    for path in paths:
        url = MULTI30K_URL.format(name=path.name)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                text = gzip.decompress(response.read())
        except (OSError, EOFError) as e:  # URLError, timeouts and bad gzip data are OSErrors
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise DataError(
                f"could not download {url} ({reason}); put {path.name} (one sentence a line) "
                f"in {path.parent} yourself"
            ) from None
        try:
            atomic_write(path, text)
        except FileError as e:
            raise DataError(f"downloaded {url}, but {e}") from None


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def load_splits(
    cfg: DataConfig, *, cache_dir: Path | None = None
) -> list[tuple[str, str, datasets.Dataset]]:
    """All splits a config names, as (role, name, texts); role is train, valid or test.

    With `valid: ""` (or `test: []`) and `valid_size` (`test_size`) rows, those rows are
    held out of the train split, a sample fixed by a constant seed.
    """
    train = load_split(cfg, cfg.train, cache_dir=cache_dir)
    held: dict[str, datasets.Dataset] = {}
    for role, name, size in (
        ("valid", cfg.valid, cfg.valid_size),
        ("test", cfg.test, cfg.test_size),
    ):
        if name or not size:
            continue
        if size >= len(train):
            raise DataError(
                f"data.{role}_size: {size} rows asked for but the train split "
                f"'{cfg.train}' has only {len(train)}"
            )
        parts = train.train_test_split(test_size=size, shuffle=True, seed=_HOLDOUT_SEED)
        train, held[role] = parts["train"], parts["test"]
    if "valid" in held:
        valid = ("valid", "valid", held["valid"])
    elif cfg.valid:
        valid = ("valid", cfg.valid, load_split(cfg, cfg.valid, cache_dir=cache_dir))
    else:
        raise DataError(
            "data.valid: empty; name a validation split, or set data.valid_size to hold "
            "rows of the train split out for validation"
        )
    tests = [("test", n, load_split(cfg, n, cache_dir=cache_dir)) for n in cfg.test]
    if "test" in held:
        tests.append(("test", "test", held["test"]))
    return [("train", cfg.train, train), valid, *tests]
