"""Preparing the corpus for training: tokenizing, cleaning, length filters, a cache.

`prepare` turns a config into tokenized, cleaned splits (loaded by `nmt.corpus`), cached
under the run directory so that a second run tokenizes nothing, with a report of what
was kept and dropped. Batches are made in `nmt.batching`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from nmt.augment import name_copies
from nmt.batching import make_batches, padding_fraction
from nmt.config import Config, DataConfig
from nmt.corpus import TEXT, DataError, RawSplit, load_splits
from nmt.errors import cut
from nmt.files import atomic_directory, atomic_write, read_back
from nmt.tokenizer import Tokenizer, train_or_load

_CACHE_VERSION = 2  # bump when the cached layout or the cleaning rules change
_REPORT = "report.json"  # in a cache folder: its splits' reports (what was kept, what dropped)
_IDS = datasets.List(datasets.Value("int32"))  # half the size of int64, vocab << 2**31


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

    def take(self, rows: list[int]) -> Split:
        """These rows, in this order (repeats allowed: the lists share their items)."""
        return Split(
            name=self.name,
            src_text=[self.src_text[r] for r in rows],
            tgt_text=[self.tgt_text[r] for r in rows],
            src_ids=[self.src_ids[r] for r in rows],
            tgt_ids=[self.tgt_ids[r] for r in rows],
        )

    @classmethod
    def concat(cls, name: str, parts: list[Split]) -> Split:
        return cls(
            name=name,
            src_text=[x for p in parts for x in p.src_text],
            tgt_text=[x for p in parts for x in p.tgt_text],
            src_ids=[x for p in parts for x in p.src_ids],
            tgt_ids=[x for p in parts for x in p.tgt_ids],
        )

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
    dropped: dict[str, int]  # reason -> pairs (train only): duplicates, cleaning
    truncated: int  # sources cut to data.max_len (valid/test only)
    weight: float = 1.0  # train: times each kept pair is seen an epoch
    invented: int = 0  # train: copies with an invented name added (data.invented_names)


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
            line = f"data: {s.role} '{s.name}': {s.total} pairs"
            if s.invented:
                line += f" and {s.invented} copies with invented names"
            line += f", {s.kept} kept"
            drops = [f"{n} {reason}" for reason, n in s.dropped.items() if n]
            if drops:
                line += ", dropped " + ", ".join(drops)
            if s.truncated:
                line += f", {s.truncated} sources truncated"
            if s.weight != 1.0:
                line += f", weight {s.weight:g} ({round(s.kept * s.weight)} pairs an epoch)"
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
    train: Split  # every corpus's, each repeated by its weight
    valid: Split  # every valid split, one after another
    tests: dict[str, Split]
    report: DataReport
    # name -> (first row, end) of each valid split in `valid`, scored apart when several
    valid_parts: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def report_lines(self) -> list[str]:
        return self.report.lines()


def prepare(cfg: Config, *, log: Callable[[str], None] = print) -> Prepared:
    """Load, clean and tokenize every split; train the run's tokenizer on first use.

    The tokenized splits are cached under `run_dir/data`, keyed by the data and tokenizer
    settings, the tokenizer model bytes and the source files' fingerprints, so a second
    call with nothing changed loads them instead of tokenizing again.
    """
    d = cfg.data
    data_dir = cfg.run_dir / "data"
    raw = load_splits(d, cache_dir=data_dir / "hf")
    trains = [r for r in raw if r.role == "train"]
    tokenizer = train_or_load(
        cfg.tokenizer,
        cfg.run_dir,
        (s.strip() for r in trains for s in r.texts["src"][:]),
        (t.strip() for r in trains for t in r.texts["tgt"][:]),
        log=log,
    )
    key = _cache_key(cfg, tokenizer, raw)
    cache_dir = data_dir / f"prepared-{key[:16]}"
    cached = _load_cache(cache_dir, len(raw), log) if d.cache else None
    if cached is not None:
        tokenized, reports = cached
    else:
        tokenized, reports = _tokenize_all(raw, tokenizer, d, key)
        if d.cache:
            _save_cache(cache_dir, tokenized, reports)
    splits = [Split.from_dataset(r.name, ds) for r, ds in zip(raw, tokenized, strict=True)]
    train = Split.concat(
        trains[0].name if d.single else "train",
        [
            s.take(_weighted_rows(len(s), r.weight, seed=cfg.train.seed))
            for r, s in zip(raw, splits, strict=True)
            if r.role == "train"
        ],
    )
    valids = [s for r, s in zip(raw, splits, strict=True) if r.role == "valid"]
    valid_parts, start = {}, 0
    for v in valids:
        valid_parts[v.name] = (start, start + len(v))
        start += len(v)
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
        cached=cached is not None,
    )
    return Prepared(
        tokenizer=tokenizer,
        train=train,
        valid=valids[0] if len(valids) == 1 else Split.concat("valid", valids),
        tests={s.name: s for r, s in zip(raw, splits, strict=True) if r.role == "test"},
        report=report,
        valid_parts=valid_parts,
    )


def _tokenize_all(
    raw: list[RawSplit], tokenizer: Tokenizer, d: DataConfig, key: str
) -> tuple[list[datasets.Dataset], list[SplitReport]]:
    """Every split tokenized and cleaned (train splits with their invented names first);
    refuses a training set that cleaning emptied."""
    if d.invented_names:
        for i, r in enumerate(r for r in raw if r.role == "train"):
            _add_invented_names(r, d.invented_names, seed=i)
    tokenized, reports = [], []
    for i, r in enumerate(raw):
        out, counts = _tokenize(r, tokenizer, d, fingerprint=f"{key[:48]}-{i}")
        tokenized.append(out)
        reports.append(counts)
    if not sum(r.kept for r in reports if r.role == "train"):
        first = reports[0]
        dropped = ", ".join(f"{n} {why}" for why, n in first.dropped.items() if n)
        raise DataError(
            f"data: the train split '{first.name}' is empty after cleaning "
            f"({first.total} pairs, dropped {dropped or 'none'}): check the files, "
            "or raise data.max_len / data.max_len_ratio"
        )
    return tokenized, reports


def _add_invented_names(raw: RawSplit, copies: float, *, seed: int) -> None:
    """Append to a train split its copies with invented names (`nmt.augment`)."""
    src, tgt = name_copies(raw.texts["src"][:], raw.texts["tgt"][:], copies, seed=seed)
    copies = datasets.Dataset.from_dict({"src": src, "tgt": tgt}, features=raw.texts.features)
    raw.texts = datasets.concatenate_datasets([raw.texts, copies])
    raw.invented = len(src)


def _weighted_rows(n: int, weight: float, *, seed: int) -> list[int]:
    """The rows of an n-pair corpus seen in an epoch under `weight`: every row int(weight)
    times, then a fixed random sample of the fraction left (the same every epoch)."""
    whole, fraction = divmod(weight, 1.0)
    rows = list(range(n)) * int(whole)
    extra = round(fraction * n)
    if extra:
        rows += sorted(random.Random(seed).sample(range(n), extra))
    return rows


def _tokenize(
    raw: RawSplit, tok: Tokenizer, d: DataConfig, *, fingerprint: str
) -> tuple[datasets.Dataset, SplitReport]:
    """Strip and tokenize one split; train splits are filtered, the others kept whole."""
    ds, role = raw.texts, raw.role
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
        {"src": TEXT, "tgt": TEXT, "src_ids": _IDS, "tgt_ids": _IDS, "drop": TEXT}
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
    cleaning = {text: counts[code] for code, text in reasons.items()}
    report = SplitReport(
        role=role,
        name=raw.name,
        total=raw.total,
        kept=len(out),
        dropped={**raw.removed, **cleaning} if role == "train" else {},
        truncated=counts["cut"],
        weight=raw.weight,
        invented=raw.invented,
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


def _cache_key(cfg: Config, tok: Tokenizer, raw: list[RawSplit]) -> str:
    """What the tokenized splits depend on; any change gives a new cache directory."""
    parts = {
        "version": _CACHE_VERSION,
        "data": dataclasses.asdict(cfg.data),
        "tokenizer": dataclasses.asdict(cfg.tokenizer),
        "models": {k: hashlib.sha256(v).hexdigest() for k, v in tok.to_bytes().items()},
        # datasets fingerprints a loaded file by path, size and modification time
        "sources": [[r.role, r.name, r.texts._fingerprint] for r in raw],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _load_cache(
    cache_dir: Path, n_splits: int, log: Callable[[str], None]
) -> tuple[list[datasets.Dataset], list[SplitReport]] | None:
    """The tokenized splits `_save_cache` wrote, or None: none there yet, or a cache that
    cannot be read (a disk error, a file changed by hand), which is removed (it is nmt's,
    in the run directory) so that the splits are tokenized and cached again."""
    if not cache_dir.exists():
        return None
    try:  # (a cache folder without its report, or with a folder there, is a damaged one)
        meta = json.loads(read_back(cache_dir / _REPORT).decode("utf-8"))
        reports = [SplitReport(**r) for r in meta["splits"]]
        if len(reports) != n_splits:
            raise ValueError(f"{len(reports)} splits, expected {n_splits}")
        tokenized = [datasets.load_from_disk(str(cache_dir / f"{i}")) for i in range(n_splits)]
    except (OSError, ValueError, RecursionError, KeyError, TypeError) as e:
        why = cut(str(e), 200)
        log(f"{cache_dir}: the tokenized data cannot be read ({why}); tokenizing again")
        shutil.rmtree(cache_dir, ignore_errors=True)
        return None
    return tokenized, reports


def _save_cache(
    cache_dir: Path, tokenized: list[datasets.Dataset], reports: list[SplitReport]
) -> None:
    """Write the splits to a temporary directory, then rename it into place in one step."""
    with atomic_directory(cache_dir) as tmp:
        for i, ds in enumerate(tokenized):
            ds.save_to_disk(str(tmp / f"{i}"))
        meta = {"splits": [dataclasses.asdict(r) for r in reports]}
        atomic_write(tmp / _REPORT, json.dumps(meta, indent=1).encode("utf-8"))
    for old in cache_dir.parent.glob("prepared-*"):  # caches of earlier settings are dead
        if old != cache_dir:
            shutil.rmtree(old, ignore_errors=True)
