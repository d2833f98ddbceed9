"""Data: loading each format, clear errors, cleaning, cached preparation, batching."""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import random
import shutil
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.batching import collate, epoch_rows, make_batches, padding_fraction
from nmt.config import Config, DataConfig, config_from_dict
from nmt.corpus import DataError, extract_pairs, load_split, load_splits
from nmt.data import prepare
from nmt.download import MULTI30K_URL, TATOEBA_URL
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny"
EN = (TINY / "train.en").read_text(encoding="utf-8").splitlines()
FR = (TINY / "train.fr").read_text(encoding="utf-8").splitlines()
MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def write_split(directory: Path, split: str, src: list[str], tgt: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (directory / f"{split}.fr").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")


def one_corpus(**keys: Any) -> DataConfig:
    """`data` written the one-corpus way (its keys directly under `data`), as a config file
    would."""
    return config_from_dict({"data": keys}).data


def with_corpus(data: DataConfig, **keys: Any) -> DataConfig:
    """`data` with its one corpus's keys changed, unchecked (as a stored config could be)."""
    return dataclasses.replace(data, corpora=(dataclasses.replace(data.corpora[0], **keys),))


def quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- loading


def test_text_files_load_aligned(tmp_path: Path) -> None:
    ds = load_split(one_corpus(dir=str(TINY)), "train", cache_dir=tmp_path)
    assert ds.column_names == ["src", "tgt"]
    assert ds["src"][:] == EN and ds["tgt"][:] == FR


def test_empty_lines_stay_rows_so_the_sides_stay_aligned(tmp_path: Path) -> None:
    write_split(tmp_path / "c", "train", ["A dog.", "", "A cat."], ["Un chien.", "", "Un chat."])
    ds = load_split(one_corpus(dir=str(tmp_path / "c")), "train", cache_dir=tmp_path)
    assert ds[:] == {"src": ["A dog.", "", "A cat."], "tgt": ["Un chien.", "", "Un chat."]}


def test_tsv_takes_two_columns_literally(tmp_path: Path) -> None:
    cfg = one_corpus(dir=str(DATA), format="tsv")
    ds = load_split(cfg, "tiny.tsv", cache_dir=tmp_path)
    assert ds.column_names == ["src", "tgt"] and len(ds) == 4
    assert ds[0] == {"src": "A horse is eating grass.", "tgt": "Un cheval mange de l'herbe."}
    assert ds[3]["src"] == '"Hello," says the girl.'  # quotes are text, not CSV quoting
    absolute = load_split(cfg, str((DATA / "tiny.tsv").resolve()), cache_dir=tmp_path)
    assert absolute[:] == ds[:]


def test_tsv_keeps_words_pandas_would_read_as_missing_or_numbers(tmp_path: Path) -> None:
    (tmp_path / "t.tsv").write_text("NA\tnull\n1.50\t007\n", encoding="utf-8")
    ds = load_split(one_corpus(dir=str(tmp_path), format="tsv"), "t.tsv", cache_dir=tmp_path)
    assert ds[:] == {"src": ["NA", "1.50"], "tgt": ["null", "007"]}


def test_jsonl_reads_fields_and_translation_dicts(tmp_path: Path) -> None:
    ds = load_split(one_corpus(dir=str(DATA), format="jsonl"), "tiny.jsonl", cache_dir=tmp_path)
    assert ds.column_names == ["src", "tgt"]
    assert ds["src"][:] == [
        "A horse is eating grass.",
        "Two birds are flying.",
        "A man opens the door.",
    ]
    assert ds[2]["tgt"] == "Un homme ouvre la porte."


def test_extract_pairs_field_rules() -> None:
    cfg = one_corpus(src_field="source", tgt_field="target", src_lang="de", tgt_lang="en")
    rows: dict[str, list[Any]] = {
        "source": ["Hallo", None],
        "target": ["Hello", None],
        "translation": [None, {"de": "Danke", "en": "Thanks"}],
    }
    assert extract_pairs(rows, cfg, where="x") == {
        "src": ["Hallo", "Danke"],
        "tgt": ["Hello", "Thanks"],
    }
    rows = {"source": ["a", "b"], "target": ["c", None], "other": ["d", "e"]}
    with pytest.raises(DataError, match=r"x: row 12 has neither the fields 'source' and 'tar"):
        extract_pairs(rows, cfg, where="x", first_row=10)


def test_jsonl_row_without_the_fields_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"en": "a", "fr": "b"}\n{"en": "c"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl: row 2 has neither"):
        load_split(one_corpus(dir=str(tmp_path), format="jsonl"), "bad.jsonl", cache_dir=tmp_path)


def test_lowercase_applies_to_both_sides(tmp_path: Path) -> None:
    ds = load_split(one_corpus(dir=str(TINY), lowercase=True), "val", cache_dir=tmp_path)
    assert ds[0] == {"src": ds[0]["src"].lower(), "tgt": ds[0]["tgt"].lower()}
    assert ds[0]["src"] != (TINY / "val.en").read_text(encoding="utf-8").splitlines()[0]


def test_line_count_mismatch_names_both_files_and_counts(tmp_path: Path) -> None:
    write_split(tmp_path, "train", ["a", "b", "c"], ["x", "y"])
    with pytest.raises(DataError) as info:
        load_split(one_corpus(dir=str(tmp_path)), "train", cache_dir=tmp_path / "hf")
    assert str(info.value) == (
        f"{tmp_path / 'train.en'} has 3 lines but {tmp_path / 'train.fr'} has 2: "
        "the two sides must be aligned line by line"
    )


def test_missing_file_names_its_path_and_the_download_option(tmp_path: Path) -> None:
    (tmp_path / "train.en").write_text("a\n", encoding="utf-8")
    with pytest.raises(DataError, match="data.download: multi30k") as info:
        load_split(one_corpus(dir=str(tmp_path)), "train", cache_dir=tmp_path / "hf")
    assert str(info.value).startswith(f"{tmp_path / 'train.fr'}: no such file")
    with pytest.raises(DataError, match=r"nope.tsv: no such file"):
        load_split(one_corpus(dir=str(tmp_path), format="tsv"), "nope.tsv")


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    write_split(tmp_path, "train", ["a", "b", "c"], ["x", "y", "z"])
    (tmp_path / "train.fr").write_bytes(b"x\ny\n\xffz\n")
    with pytest.raises(DataError, match=r"train.fr: line 3 is not valid UTF-8 \(byte 0xff"):
        load_split(one_corpus(dir=str(tmp_path)), "train", cache_dir=tmp_path / "hf")


def test_download_failure_says_which_url_and_where_to_put_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(request: urllib.request.Request, timeout: float) -> None:
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    cfg = one_corpus(dir=str(tmp_path / "m30k"), download="multi30k")
    with pytest.raises(DataError) as info:
        load_split(cfg, "val", cache_dir=tmp_path / "hf")
    url = MULTI30K_URL.format(name="val.en")
    assert str(info.value) == (
        f"could not download {url} (no network); put val.en (one sentence a line) "
        f"in {tmp_path / 'm30k'} yourself"
    )
    assert not any((tmp_path / "m30k").glob("*"))  # no half-written file left behind


def test_download_gunzips_missing_files_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[str] = []

    def fake(request: urllib.request.Request, timeout: float) -> io.BytesIO:
        fetched.append(request.full_url)
        text = "A dog.\n" if request.full_url.endswith(".en.gz") else "Un chien.\n"
        return io.BytesIO(gzip.compress(text.encode()))

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    write_split(tmp_path, "val", ["A dog."], ["Un chien."])
    (tmp_path / "val.fr").unlink()  # only the missing side is fetched
    ds = load_split(one_corpus(dir=str(tmp_path), download="multi30k"), "val", cache_dir=tmp_path)
    assert fetched == [MULTI30K_URL.format(name="val.fr")]
    assert ds[:] == {"src": ["A dog."], "tgt": ["Un chien."]}


def test_download_tatoeba_unzips_the_pairs_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[str] = []
    pairs = "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272\nHi.\tSalut.\tCC\n"

    def fake(request: urllib.request.Request, timeout: float) -> io.BytesIO:
        fetched.append(request.full_url)
        assert "nmt" in request.get_header("User-agent")
        data = io.BytesIO()
        with zipfile.ZipFile(data, "w") as z:
            z.writestr("fra.txt", pairs)
            z.writestr("_about.txt", "attribution")
        return io.BytesIO(data.getvalue())

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    cfg = one_corpus(dir=str(tmp_path / "tatoeba"), format="tsv", download="tatoeba")
    ds = load_split(cfg, "fra-eng.tsv", cache_dir=tmp_path / "hf")
    assert fetched == [TATOEBA_URL.format(lang="fra")]
    assert ds[:] == {"src": ["Go.", "Hi."], "tgt": ["Va !", "Salut."]}
    unknown = with_corpus(dataclasses.replace(cfg, tgt_lang="xx"), dir=str(tmp_path / "other"))
    with pytest.raises(DataError, match="data.download: tatoeba knows English with fr, de"):
        load_split(unknown, "fra-eng.tsv", cache_dir=tmp_path / "hf")


def _stand_in(path: Path, kind: str) -> None:
    """Something of the user's where a split's file goes: a folder, a pipe, a broken link."""
    if kind == "a folder":
        path.mkdir()
        (path / "notes.txt").write_text("mine", encoding="utf-8")
    elif kind == "a pipe":
        os.mkfifo(path)
    else:
        path.symlink_to(path.parent / "unmounted" / path.name)


@pytest.mark.parametrize("kind", ["a folder", "a pipe", "a broken link"])
@pytest.mark.parametrize("fmt", ["text", "tsv"])
def test_a_thing_of_the_users_where_a_split_goes_is_named_and_neither_read_nor_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, fmt: str
) -> None:
    # Said "no such file" before; and where a download was set, the download was written over
    # a broken link or a pipe (a folder failed after the download). A pipe was never the
    # problem's name: opening it to read blocks for ever (the test's timeout would fail it).
    def no_download(request: urllib.request.Request, timeout: float) -> None:
        raise AssertionError(f"downloaded {request.full_url}")

    monkeypatch.setattr(urllib.request, "urlopen", no_download)
    corpus = tmp_path / "corpus"
    write_split(corpus, "train", ["a"], ["x"])
    name, download = ("train.fr", "multi30k") if fmt == "text" else ("fra-eng.tsv", "tatoeba")
    split = "train" if fmt == "text" else name
    (corpus / name).unlink(missing_ok=True)
    _stand_in(corpus / name, kind)
    before = sorted((p.name, p.is_symlink(), p.is_dir()) for p in corpus.rglob("*"))
    cfg = one_corpus(dir=str(corpus), format=fmt, download=download)
    with pytest.raises(DataError) as info:
        load_split(cfg, split, cache_dir=tmp_path / "hf")
    assert str(info.value).startswith(f"{corpus / name}: {kind} where ")
    assert "nmt neither reads nor replaces it" in str(info.value)
    assert sorted((p.name, p.is_symlink(), p.is_dir()) for p in corpus.rglob("*")) == before


def test_valid_and_test_can_be_held_out_of_train(tmp_path: Path) -> None:
    cfg = one_corpus(
        dir=str(DATA), format="tsv", train="tiny.tsv", valid="", valid_size=1, test=(), test_size=1
    )
    splits = load_splits(cfg, cache_dir=tmp_path)
    assert [(r.role, r.name, len(r.texts)) for r in splits] == [
        ("train", "tiny.tsv", 2),
        ("valid", "valid", 1),
        ("test", "test", 1),
    ]
    seen = sorted(s for r in splits for s in r.texts["src"][:])
    assert seen == sorted(load_split(cfg, "tiny.tsv", cache_dir=tmp_path)["src"][:])
    again = load_splits(cfg, cache_dir=tmp_path)
    assert again[1].texts[:] == splits[1].texts[:]  # the same rows every time
    with pytest.raises(DataError, match="no corpus names a validation split"):
        load_splits(with_corpus(cfg, valid_size=0), cache_dir=tmp_path)
    with pytest.raises(DataError, match="data.valid_size: 4 rows"):
        load_splits(with_corpus(cfg, valid_size=4), cache_dir=tmp_path)


# --------------------------------------------------------------------------- preparation


def corpus_config(tmp_path: Path, **data: object) -> Config:
    return config_from_dict(
        {
            "data": {"dir": str(tmp_path / "corpus"), "test": ["test"], **data},
            "tokenizer": {"vocab_size": 200},
            "train": {"batch_size": 8},
            "run": {"dir": str(tmp_path / "run")},
        }
    )


def write_tiny(tmp_path: Path) -> None:
    for split in ("train", "val", "test"):
        src = (TINY / f"{split}.en").read_text(encoding="utf-8").splitlines()
        tgt = (TINY / f"{split}.fr").read_text(encoding="utf-8").splitlines()
        write_split(tmp_path / "corpus", split, src, tgt)


def test_cleaning_drops_train_pairs_by_reason_and_keeps_every_test_pair(tmp_path: Path) -> None:
    long = "A dog runs in the park. " * 8
    write_split(
        tmp_path / "corpus",
        "train",
        [*EN, "", "A dog.", long, "Dog."],
        [*FR, "Un chien.", "   ", "Un chien court dans le parc.", FR[0] + " " + FR[1]],
    )
    long_valid = "A cat sleeps on the red sofa. " * 8  # not a training source (dedup)
    write_split(tmp_path / "corpus", "val", ["", long_valid], ["Rien.", "Long."])
    write_split(tmp_path / "corpus", "test", ["  A cat.  "], ["Un chat."])
    cfg = corpus_config(tmp_path, max_len=40, max_len_ratio=3.0)
    prepared = prepare(cfg, log=quiet)
    train, valid, test = prepared.report.splits
    assert (train.total, train.kept) == (len(EN) + 4, len(EN))
    assert train.dropped == {
        "duplicates": 0,
        "with a source in a valid/test set": 0,
        "with an empty side": 2,
        "longer than 40 tokens": 1,
        "with a length ratio above 3": 1,
    }
    assert prepared.train.src_text == EN
    assert (valid.total, valid.kept, valid.truncated) == (2, 2, 1)
    assert prepared.valid.src_text == ["", long_valid.strip()]  # BLEU needs the whole text
    assert [len(s) for s in prepared.valid.src_ids] == [0, 40]
    assert prepared.tests["test"].src_text == ["A cat."]
    lines = prepared.report_lines()
    assert "dropped 2 with an empty side, 1 longer than 40 tokens" in lines[0]
    assert "1 sources truncated" in lines[1]


def test_prepare_caches_and_invalidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tiny(tmp_path)
    cfg = corpus_config(tmp_path)
    first = prepare(cfg, log=quiet)
    assert not first.report.cached

    def no_encoding(self: Tokenizer, sentences: list[str]) -> list[list[int]]:
        raise AssertionError("tokenized again although the cache was valid")

    with monkeypatch.context() as m:
        m.setattr(Tokenizer, "encode_src", no_encoding)
        second = prepare(cfg, log=quiet)
    assert second.report.cached and "loaded from" in second.report_lines()[-1]
    assert second.train == first.train and second.tests == first.tests

    # A changed data setting or changed files are tokenized again, and the dead cache goes.
    third = prepare(
        dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_len=10)), log=quiet
    )
    assert not third.report.cached and 0 < len(third.train) < len(first.train)
    with (tmp_path / "corpus" / "train.en").open("a", encoding="utf-8") as f:
        f.write("A red bird.\n")
    with (tmp_path / "corpus" / "train.fr").open("a", encoding="utf-8") as f:
        f.write("Un oiseau rouge.\n")
    fourth = prepare(cfg, log=quiet)
    assert not fourth.report.cached and fourth.train.src_text[-1] == "A red bird."
    assert len(list((tmp_path / "run" / "data").glob("prepared-*"))) == 1


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda d: (d / "report.json").write_text('{"spl'), "Unterminated string"),
        (lambda d: (d / "report.json").write_text('{"splits": [1]}'), "must be a mapping"),
        (lambda d: (d / "report.json").write_text('{"splits": []}'), "0 splits, expected 3"),
        (lambda d: (d / "report.json").write_text("[" * 100_000), "recursion"),
        (lambda d: shutil.rmtree(d / "1"), "not found"),
        (lambda d: ((d / "report.json").unlink(), (d / "report.json").mkdir()), "Is a directory"),
        (lambda d: (d / "report.json").unlink(), "No such file"),
        (lambda d: next((d / "0").glob("*.arrow")).write_text("not arrow"), ""),
    ],
    ids=[
        "cut short",
        "a number for a split",
        "no splits",
        "nested",
        "a split gone",
        "arrow",
        "a folder for the report",
        "no report",
    ],  # fmt: skip
)
def test_a_damaged_cache_is_tokenized_again(tmp_path: Path, damage, says) -> None:
    """The cache is nmt's, in the run directory: one that cannot be read is said, removed and
    written again, not a traceback."""
    write_tiny(tmp_path)
    cfg = corpus_config(tmp_path)
    first = prepare(cfg, log=quiet)
    (cache,) = (tmp_path / "run" / "data").glob("prepared-*")
    damage(cache)
    lines: list[str] = []
    second = prepare(cfg, log=lines.append)
    (said,) = [line for line in lines if "cannot be read" in line]
    assert said.startswith(f"{cache}: the tokenized data cannot be read (") and says in said
    assert said.endswith("); tokenizing again")
    assert not second.report.cached and second.train == first.train
    assert prepare(cfg, log=quiet).report.cached  # written again, whole


def test_prepare_without_cache_writes_no_tokenized_splits(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    prepared = prepare(corpus_config(tmp_path, cache=False), log=quiet)
    assert prepared.report.cache_dir is None and len(prepared.train) == len(EN)
    assert not list((tmp_path / "run" / "data").glob("prepared-*"))


# --------------------------------------------------------------------------- batching


def random_lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(0, 30) for _ in range(n)]
    return src, [max(0, s + rng.randint(-4, 4)) for s in src]


def test_batches_respect_size_and_token_budget_and_cover_every_row() -> None:
    src, tgt = random_lengths(500)
    for batch_size, batch_tokens in ((16, None), (64, 300), (1000, 150)):
        batches = make_batches(
            src,
            tgt,
            batch_size=batch_size,
            batch_tokens=batch_tokens,
            shuffle=True,
            seed=3,
            epoch=0,
        )
        assert sorted(i for b in batches for i in b) == list(range(500))
        for b in batches:
            assert len(b) <= batch_size
            width = max(max(src[i], tgt[i]) + 1 for i in b)
            assert batch_tokens is None or width * len(b) <= batch_tokens


def test_a_row_over_the_token_budget_gets_a_batch_of_its_own() -> None:
    batches = make_batches(
        [3, 50, 3], [3, 50, 3], batch_size=8, batch_tokens=20, shuffle=False, seed=0, epoch=0
    )
    assert batches == [[0, 2], [1]]


def test_batches_are_reproducible_from_seed_and_epoch() -> None:
    src, tgt = random_lengths(300)

    def batches(seed: int, epoch: int) -> list[list[int]]:
        return make_batches(
            src, tgt, batch_size=16, batch_tokens=None, shuffle=True, seed=seed, epoch=epoch
        )

    assert batches(1, 0) == batches(1, 0)
    assert batches(1, 0) != batches(1, 1)
    assert batches(1, 0) != batches(2, 0)


def test_unshuffled_batches_run_from_short_to_long() -> None:
    src, tgt = random_lengths(200)
    batches = make_batches(
        src, tgt, batch_size=10, batch_tokens=None, shuffle=False, seed=0, epoch=0
    )
    order = [i for b in batches for i in b]
    assert [(src[i], tgt[i]) for i in order] == sorted(zip(src, tgt, strict=True))


def test_padding_fraction_counts_both_sides_with_eos() -> None:
    # padded: 2 rows x (max src 3+1) + 2 rows x (max tgt 2+1) = 14; real: 2+4 + 3+3 = 12
    assert padding_fraction([[0, 1]], [1, 3], [2, 2]) == pytest.approx(1 - 12 / 14)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs ../shared/data/multi30k")
def test_padding_under_ten_percent_on_multi30k() -> None:
    def lengths(lang: str) -> list[int]:  # words: a proxy for subword counts
        lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        return [len(line.split()) for line in lines]

    src, tgt = lengths("en"), lengths("fr")
    batches = make_batches(
        src, tgt, batch_size=64, batch_tokens=None, shuffle=True, seed=1, epoch=0
    )
    assert padding_fraction(batches, src, tgt) < 0.10


def test_collate_places_bos_eos_and_padding() -> None:
    batch = collate([[5, 6, 7], [8]], [[9], [10, 11, 12]], [4, 2])
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.src_lens.tolist() == [4, 2]
    assert batch.tgt_in.tolist() == [[BOS_ID, 9, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12]]
    assert batch.tgt_out.tolist() == [[9, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.index.tolist() == [4, 2]
    assert batch.n_tgt_tokens == 6 == int((batch.tgt_out != PAD_ID).sum())
    for t in (batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out, batch.index):
        assert t.dtype == torch.int64
    source_only = collate([[5], [6, 7]], None, [0, 1])
    assert source_only.src.shape == (2, 3) and source_only.tgt_in.shape == (2, 0)


def test_batch_to_keeps_lengths_on_the_cpu() -> None:
    moved = collate([[5, 6]], [[7]], [0]).to("meta")
    assert moved.src.device.type == moved.tgt_out.device.type == "meta"
    assert moved.src_lens.device.type == "cpu"


def test_epoch_rows_split_evenly_across_ranks() -> None:
    src, tgt = random_lengths(101)
    train = config_from_dict({"train": {"batch_size": 4, "seed": 7}}).train
    whole = epoch_rows(src, tgt, train, epoch=2)
    assert sorted(i for b in whole for i in b) == list(range(101))
    assert epoch_rows(src, tgt, train, epoch=2) == whole  # a resumed run finds its place
    ranks = [epoch_rows(src, tgt, train, 2, rank=r, world=3) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1  # equal steps on every rank
    assert ranks[1] == whole[1 : 3 * len(ranks[1]) : 3]


def test_a_pipe_for_the_cache_report_is_never_opened(tmp_path: Path) -> None:
    """A pipe where the cache's report.json belongs would block the read for ever: it is a
    damaged cache like the others (`nmt.files.read_back`), said, removed and made again."""
    write_tiny(tmp_path)
    cfg = corpus_config(tmp_path)
    prepare(cfg, log=quiet)
    (cache,) = (tmp_path / "run" / "data").glob("prepared-*")
    (cache / "report.json").unlink()
    os.mkfifo(cache / "report.json")
    lines: list[str] = []
    assert not prepare(cfg, log=lines.append).report.cached
    assert any("cannot be read (not a regular file" in line for line in lines)
    assert prepare(cfg, log=quiet).report.cached
