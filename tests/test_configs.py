"""Every shipped YAML under configs/ is a valid config."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.config import DATA_DIR_ENV, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_the_shipped_configs_are_there() -> None:
    names = {p.name for p in CONFIGS}
    assert {"tiny.yaml", "multi30k_en_fr.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(path)
    assert cfg.name == path.stem


def test_tiny_config_points_at_the_committed_sample_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    (corpus,) = cfg.data.corpus_list()
    for split in (corpus.train, corpus.valid, *corpus.test):
        for lang in (cfg.data.src_lang, cfg.data.tgt_lang):
            assert (ROOT / corpus.dir / f"{split}.{lang}").is_file()


def test_shipped_corpora_share_one_data_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped config but the toy one finds its corpora under NMT_DATA_DIR, one folder
    per corpus: `NMT_DATA_DIR=../shared/data` serves them all."""
    monkeypatch.setenv(DATA_DIR_ENV, "/data-root")
    folders = {}
    for path in CONFIGS:
        if path.name != "tiny.yaml":
            for corpus in load_config(path).data.corpus_list():
                folders[path.name, corpus.name] = corpus.dir
    assert folders[("general_en_fr.yaml", "tatoeba")] == "/data-root/tatoeba"
    assert set(folders.values()) == {"/data-root/multi30k", "/data-root/tatoeba"}
