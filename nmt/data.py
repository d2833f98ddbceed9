"""Parallel corpora: loading through `datasets`, cleaning, cached tokenization, batching.

Loading gives a `datasets.Dataset` with text columns `src` and `tgt` for any source the
config names (aligned text files, TSV, JSON lines, the Hugging Face hub; local paths or
URLs). `prepare` turns a config into tokenized, cleaned splits, cached under the run
directory. Batches are made in `nmt.batching`.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from nmt.batching import make_batches, padding_fraction
from nmt.config import Config, DataConfig
from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer, train_or_load

# Library calls must not draw progress bars or log into the user's terminal.
datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}.gz"
_HOLDOUT_SEED = 1234  # held-out valid/test rows must not move when train.seed changes
_CACHE_VERSION = 1  # bump when the cached layout or the cleaning rules change
_STR = datasets.Value("string")
_IDS = datasets.List(datasets.Value("int32"))  # half the size of int64, vocab << 2**31


class DataError(NmtError):
    """A corpus that cannot be read or does not have the expected layout."""


# --------------------------------------------------------------------------- loading


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
            features=datasets.Features({"src": _STR, "tgt": _STR}),
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

    Each file is gunzipped into place through a temporary file and a rename, so an
    interrupted download never leaves a truncated corpus behind.
    """
    for path in paths:
        url = MULTI30K_URL.format(name=path.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                text = gzip.decompress(response.read())
            with os.fdopen(fd, "wb") as f:
                f.write(text)
            os.replace(tmp, path)
        except (OSError, EOFError) as e:  # URLError, timeouts and bad gzip data are OSErrors
            Path(tmp).unlink(missing_ok=True)
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise DataError(
                f"could not download {url} ({reason}); put {path.name} (one sentence a line) "
                f"in {path.parent} yourself"
            ) from None


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


# --------------------------------------------------------------------------- preparation


@dataclass
class Split:
    """One tokenized split, as plain lists for fast random access while batching."""

    name: str
    src_text: list[str]  # stripped (and lowercased if data.lowercase), for BLEU and display
    tgt_text: list[str]
    src_ids: list[list[int]]  # no BOS/EOS: `collate` adds them
    tgt_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.src_ids)

    @classmethod
    def from_dataset(cls, name: str, ds: datasets.Dataset) -> Split:
        return cls(
            name=name,
            src_text=ds["src"][:],
            tgt_text=ds["tgt"][:],
            src_ids=ds["src_ids"][:],
            tgt_ids=ds["tgt_ids"][:],
        )


@dataclass(frozen=True)
class SplitReport:
    """What cleaning did to one split."""

    role: str  # train, valid or test
    name: str
    total: int
    kept: int
    dropped: dict[str, int]  # reason -> pairs (train only)
    truncated: int  # sources cut to data.max_len (valid/test only)


@dataclass(frozen=True)
class DataReport:
    """Cleaning counts per split, and how the training batches look."""

    splits: tuple[SplitReport, ...]
    train_batches: int
    padding_fraction: float
    cache_dir: str | None  # None when data.cache is off
    cached: bool  # True when the tokenized splits came from the cache

    def lines(self) -> list[str]:
        out = []
        for s in self.splits:
            line = f"data: {s.role} '{s.name}': {s.total} pairs, {s.kept} kept"
            drops = [f"{n} {reason}" for reason, n in s.dropped.items() if n]
            if drops:
                line += ", dropped " + ", ".join(drops)
            if s.truncated:
                line += f", {s.truncated} sources truncated"
            out.append(line)
        out.append(
            f"data: {self.train_batches} training batches an epoch, "
            f"{self.padding_fraction:.1%} of their tokens are padding"
        )
        if self.cache_dir is None:
            out.append("data: tokenized splits not cached (data.cache: false)")
        else:
            verb = "loaded from" if self.cached else "tokenized and cached in"
            out.append(f"data: splits {verb} {self.cache_dir}")
        return out


@dataclass
class Prepared:
    """Everything training needs from the data: tokenizer, tokenized splits, report."""

    tokenizer: Tokenizer
    train: Split
    valid: Split
    tests: dict[str, Split]
    report: DataReport

    def report_lines(self) -> list[str]:
        return self.report.lines()


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


def prepare(cfg: Config, *, log: Callable[[str], None] = print) -> Prepared:
    """Load, clean and tokenize every split; train the run's tokenizer on first use.

    The tokenized splits are cached under `run_dir/data`, keyed by the data and tokenizer
    settings, the tokenizer model bytes and the source files' fingerprints, so a second
    call with nothing changed loads them instead of tokenizing again.
    """
    d = cfg.data
    data_dir = cfg.run_dir / "data"
    raw = load_splits(d, cache_dir=data_dir / "hf")
    train_raw = raw[0][2]
    tokenizer = train_or_load(
        cfg.tokenizer,
        cfg.run_dir,
        (s.strip() for s in train_raw["src"][:]),
        (t.strip() for t in train_raw["tgt"][:]),
        log=log,
    )
    key = _cache_key(cfg, tokenizer, raw)
    cache_dir = data_dir / f"prepared-{key[:16]}"
    cached = d.cache and (cache_dir / "report.json").is_file()
    if cached:
        meta = json.loads((cache_dir / "report.json").read_text(encoding="utf-8"))
        reports = [SplitReport(**r) for r in meta["splits"]]
        tokenized = [datasets.load_from_disk(str(cache_dir / f"{i}")) for i in range(len(raw))]
    else:
        tokenized, reports = [], []
        for i, (role, name, ds) in enumerate(raw):
            out, counts = _tokenize(
                ds, tokenizer, d, role=role, name=name, fingerprint=f"{key[:48]}-{i}"
            )
            tokenized.append(out)
            reports.append(counts)
        if d.cache:
            _save_cache(cache_dir, tokenized, reports)
    splits = [Split.from_dataset(name, ds) for (_, name, _), ds in zip(raw, tokenized, strict=True)]
    train = splits[0]
    src_lens = [len(s) for s in train.src_ids]
    tgt_lens = [len(t) for t in train.tgt_ids]
    batches = make_batches(
        src_lens,
        tgt_lens,
        batch_size=cfg.train.batch_size,
        batch_tokens=cfg.train.batch_tokens,
        shuffle=True,
        seed=cfg.train.seed,
        epoch=0,
    )
    report = DataReport(
        splits=tuple(reports),
        train_batches=len(batches),
        padding_fraction=padding_fraction(batches, src_lens, tgt_lens),
        cache_dir=str(cache_dir) if d.cache else None,
        cached=cached,
    )
    return Prepared(
        tokenizer=tokenizer,
        train=train,
        valid=splits[1],
        tests={s.name: s for s in splits[2:]},
        report=report,
    )


def _tokenize(
    ds: datasets.Dataset, tok: Tokenizer, d: DataConfig, *, role: str, name: str, fingerprint: str
) -> tuple[datasets.Dataset, SplitReport]:
    """Strip and tokenize one split; the train split is filtered, the others kept whole."""
    reasons = {
        "empty": "with an empty side",
        "long": f"longer than {d.max_len} tokens",
        "ratio": f"with a length ratio above {d.max_len_ratio:g}",
    }

    def fn(batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        src = [s.strip() for s in batch["src"]]
        tgt = [t.strip() for t in batch["tgt"]]
        src_ids, tgt_ids = tok.encode_src(src), tok.encode_tgt(tgt)
        if role == "train":
            drop = [_drop_reason(len(s), len(t), d) for s, t in zip(src_ids, tgt_ids, strict=True)]
        else:  # BLEU is computed on every pair: nothing dropped, long sources cut
            drop = ["cut" if len(s) > d.max_len else "" for s in src_ids]
            src_ids = [s[: d.max_len] for s in src_ids]
        return {"src": src, "tgt": tgt, "src_ids": src_ids, "tgt_ids": tgt_ids, "drop": drop}

    features = datasets.Features(
        {"src": _STR, "tgt": _STR, "src_ids": _IDS, "tgt_ids": _IDS, "drop": _STR}
    )
    out = ds.map(
        fn,
        batched=True,
        batch_size=2000,
        features=features,
        keep_in_memory=True,  # the result goes to our own cache below, not datasets' one
        new_fingerprint=fingerprint,  # the tokenizer cannot be hashed; the cache key can
    )
    counts = Counter(out["drop"][:])
    if role == "train":
        out = out.filter(lambda b: [r == "" for r in b["drop"]], batched=True, keep_in_memory=True)
    out = out.remove_columns("drop")
    report = SplitReport(
        role=role,
        name=name,
        total=len(ds),
        kept=len(out),
        dropped={text: counts[code] for code, text in reasons.items()} if role == "train" else {},
        truncated=counts["cut"],
    )
    return out, report


def _drop_reason(n_src: int, n_tgt: int, d: DataConfig) -> str:
    """Why a training pair (of n_src, n_tgt subword tokens) is dropped; "" keeps it."""
    if n_src == 0 or n_tgt == 0:
        return "empty"
    if max(n_src, n_tgt) > d.max_len:
        return "long"
    if max(n_src, n_tgt) / min(n_src, n_tgt) > d.max_len_ratio:
        return "ratio"
    return ""


def _cache_key(cfg: Config, tok: Tokenizer, raw: list[tuple[str, str, datasets.Dataset]]) -> str:
    """What the tokenized splits depend on; any change gives a new cache directory."""
    parts = {
        "version": _CACHE_VERSION,
        "data": dataclasses.asdict(cfg.data),
        "tokenizer": dataclasses.asdict(cfg.tokenizer),
        "models": {k: hashlib.sha256(v).hexdigest() for k, v in tok.to_bytes().items()},
        # datasets fingerprints a loaded file by path, size and modification time
        "sources": [[role, name, ds._fingerprint] for role, name, ds in raw],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _save_cache(
    cache_dir: Path, tokenized: list[datasets.Dataset], reports: list[SplitReport]
) -> None:
    """Write the splits to a temporary directory, then rename it into place in one step."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".prepared-", dir=cache_dir.parent))
    try:
        for i, ds in enumerate(tokenized):
            ds.save_to_disk(str(tmp / f"{i}"))
        meta = {"splits": [dataclasses.asdict(r) for r in reports]}
        (tmp / "report.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        os.replace(tmp, cache_dir)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (cache_dir / "report.json").is_file():  # not another process that won the race
            raise
    for old in cache_dir.parent.glob("prepared-*"):  # caches of earlier settings are dead
        if old != cache_dir:
            shutil.rmtree(old, ignore_errors=True)
