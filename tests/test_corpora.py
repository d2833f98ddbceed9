"""Several corpora in one run (data.corpora): names, weights, duplicates removed across
corpora and against valid/test sets, one tokenizer on the union, errors naming the corpus,
the data root and what changed about NMT_DATA_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_data import EN, FR, quiet, write_split
from typer.testing import CliRunner

from nmt.cli import app
from nmt.config import Config, config_from_dict, load_config
from nmt.corpus import DUPLICATE, HELD_OUT, DataError, load_splits
from nmt.data import prepare
from nmt.model import build_model
from nmt.tokenizer import UNK_ID
from nmt.validation import validate

# Corpus B: a TSV of pairs of its own, with a letter (ø) that corpus A never uses.
B_PAIRS = [
    ("Hello.", "Bonjour."),
    ("Thank you.", "Merci."),
    ("I am tired.", "Je suis fatigué."),
    ("Where is the station?", "Où est la gare ?"),
    ("Søren is here.", "Søren est ici."),
    ("I like tea.", "J'aime le thé."),
    ("See you tomorrow.", "À demain."),
    ("It is raining.", "Il pleut."),
    (EN[0], FR[0]),  # also in corpus A: an exact duplicate across corpora
    ("Good night.", "Bonne nuit."),
]
B_TEST = [("I like tea.", "J'adore le thé."), ("Good morning.", "Bonjour.")]


def write_corpora(root: Path) -> None:
    write_split(root / "a", "train", EN, FR)
    write_split(root / "a", "val", EN[:3], FR[:3])
    write_split(root / "a", "test", EN[3:5], FR[3:5])
    (root / "b").mkdir(parents=True)
    rows = "".join(f"{s}\t{t}\n" for s, t in B_PAIRS)
    (root / "b" / "pairs.tsv").write_text(rows, encoding="utf-8")
    tests = "".join(f"{s}\t{t}\n" for s, t in B_TEST)
    (root / "b" / "test.tsv").write_text(tests, encoding="utf-8")


def two_corpora(tmp_path: Path, *, weight_a: float = 1.0, **data: object) -> Config:
    return config_from_dict(
        {
            "data": {
                "root": str(tmp_path / "root"),
                "corpora": [
                    {"name": "a", "valid": "val", "test": ["test"], "weight": weight_a},
                    {
                        "name": "b",
                        "format": "tsv",
                        "train": "pairs.tsv",
                        "valid_size": 2,
                        "test": ["test.tsv"],
                    },
                ],
                **data,
            },
            "tokenizer": {"vocab_size": 200},
            "model": {"emb_size": 8, "enc_hidden": 8, "dec_hidden": 16},
            "train": {"batch_size": 8},
            "run": {"dir": str(tmp_path / "run")},
        }
    )


def test_splits_are_named_by_corpus_and_duplicates_removed(tmp_path: Path) -> None:
    write_corpora(tmp_path / "root")
    raw = load_splits(two_corpora(tmp_path).data, cache_dir=tmp_path / "hf")
    names = [(r.role, r.name) for r in raw]
    assert names == [
        ("train", "a/train"),
        ("train", "b/pairs.tsv"),
        ("valid", "a/val"),
        ("valid", "b/valid"),
        ("test", "a/test"),
        ("test", "b/test.tsv"),
    ]
    a, b = raw[0], raw[1]
    # A's sources 0-4 are in its own val/test: removed from its training pairs.
    assert a.removed == {DUPLICATE: 0, HELD_OUT: 5} and len(a.texts) == len(EN) - 5
    held = {s for r in raw[2:] for s in r.texts["src"][:]}
    assert not held & set(a.texts["src"][:]) and not held & set(b.texts["src"][:])
    # B (8 rows after its 2-row valid split) loses the pair A has, unless the sample held
    # it out, and "I like tea." (its source is in B's test set).
    b_valid = set(raw[3].texts["src"][:])
    expected_dups = 0 if EN[0] in b_valid else 1
    assert b.removed[DUPLICATE] == expected_dups
    assert b.removed[HELD_OUT] == (0 if "I like tea." in b_valid else 1)
    assert b.total == 8 and len(b.texts) == 8 - sum(b.removed.values())

    kept_all = load_splits(two_corpora(tmp_path, dedup=False).data, cache_dir=tmp_path / "hf")
    assert len(kept_all[0].texts) == len(EN) and kept_all[0].removed == {}


def test_weights_repeat_a_corpus_and_the_tokenizer_reads_every_corpus(tmp_path: Path) -> None:
    write_corpora(tmp_path / "root")
    once = prepare(two_corpora(tmp_path), log=quiet)
    a_kept, b_kept = (s.kept for s in once.report.splits[:2])
    assert len(once.train) == a_kept + b_kept
    twice = prepare(two_corpora(tmp_path, weight_a=2.5), log=quiet)
    assert len(twice.train) == round(2.5 * a_kept) + b_kept
    a_rows = twice.train.src_text[: round(2.5 * a_kept)]
    counts = {s: a_rows.count(s) for s in set(a_rows)}
    assert sorted(set(counts.values())) == [2, 3]  # each twice, half of them once more
    assert sum(c == 3 for c in counts.values()) == round(0.5 * a_kept)
    again = prepare(two_corpora(tmp_path, weight_a=2.5), log=quiet)
    assert again.train.src_text == twice.train.src_text  # the sample is fixed
    # one tokenizer, trained on both corpora: B's ø is a piece, not unknown
    assert UNK_ID not in once.tokenizer.encode_src(["Søren"])[0]
    lines = twice.report_lines()
    assert f"data: train 'a/train': {len(EN)} pairs, {a_kept} kept" in lines[0]
    assert "5 with a source in a valid/test set" in lines[0]
    assert f"weight 2.5 ({round(2.5 * a_kept)} pairs an epoch)" in lines[0]
    assert lines[1].startswith("data: train 'b/pairs.tsv': 8 pairs")
    assert set(once.tests) == {"a/test", "b/test.tsv"}


def test_each_valid_split_is_scored_and_all_of_them_together(tmp_path: Path) -> None:
    write_corpora(tmp_path / "root")
    cfg = two_corpora(tmp_path)
    prepared = prepare(cfg, log=quiet)
    assert prepared.valid_parts == {"a/val": (0, 3), "b/valid": (3, 5)}
    assert len(prepared.valid) == 5
    torch.manual_seed(0)
    model = build_model(
        cfg.model,
        src_vocab_size=prepared.tokenizer.src_vocab_size,
        tgt_vocab_size=prepared.tokenizer.tgt_vocab_size,
        shared_vocab=prepared.tokenizer.joint,
    )
    scores = validate(model, prepared, cfg, torch.device("cpu"), "fp32")
    assert {"val_bleu", "val_bleu/a/val", "val_bleu/b/valid"} <= set(scores)


def test_a_missing_corpus_is_named_with_where_to_put_it(tmp_path: Path) -> None:
    write_corpora(tmp_path / "root")
    (tmp_path / "root" / "b" / "pairs.tsv").unlink()
    with pytest.raises(DataError, match=r"pairs.tsv: no such file \(data.corpora\[1\]\.format"):
        load_splits(two_corpora(tmp_path).data, cache_dir=tmp_path / "hf")
    (tmp_path / "root" / "a" / "val.fr").unlink()
    with pytest.raises(DataError, match="'val' split of corpus 'a' in .*root/a as val.en"):
        load_splits(two_corpora(tmp_path).data, cache_dir=tmp_path / "hf")


def test_the_old_nmt_data_dir_convention_is_explained(tmp_path: Path, monkeypatch) -> None:
    """NMT_DATA_DIR used to name the Multi30k folder itself; it now names the data root."""
    write_split(tmp_path / "multi30k", "train", EN, FR)
    monkeypatch.setenv("NMT_DATA_DIR", str(tmp_path / "multi30k"))
    cfg = load_config(Path(__file__).parents[1] / "configs" / "multi30k_en_fr.yaml")
    with pytest.raises(DataError, match=f"use NMT_DATA_DIR={tmp_path}$"):
        load_splits(cfg.data, cache_dir=tmp_path / "hf")
    # a corpus folder given relative to the old place: told to set the root instead
    monkeypatch.delenv("NMT_DATA_DIR")
    cfg = load_config(
        Path(__file__).parents[1] / "configs" / "multi30k_en_fr.yaml",
        [f"data.dir=../{tmp_path.name}/multi30k", "data.download=none"],
    )
    with pytest.raises(DataError, match="relative to the data root data.root"):
        load_splits(cfg.data, cache_dir=tmp_path / "hf")


def test_prepare_names_each_corpus_on_the_command_line(tmp_path: Path) -> None:
    write_corpora(tmp_path / "root")
    config = tmp_path / "two.yaml"
    config.write_text(two_corpora(tmp_path).to_yaml(), encoding="utf-8")
    result = CliRunner().invoke(app, ["prepare", str(config)])
    assert result.exit_code == 0, result.output
    assert "data: train 'a/train'" in result.output
    assert "data: train 'b/pairs.tsv'" in result.output
    assert "data: test 'b/test.tsv': 2 pairs, 2 kept" in result.output
    broken = config.read_text(encoding="utf-8").replace("pairs.tsv", "nope.tsv")
    config.write_text(broken, encoding="utf-8")
    result = CliRunner().invoke(app, ["prepare", str(config)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "nope.tsv: no such file (data.corpora[1].format" in result.output
