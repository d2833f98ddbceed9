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
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    cfg = load_config(path)
    assert cfg.name == path.stem


def test_tiny_config_points_at_the_committed_sample_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    data = ROOT / cfg.data.dir
    for split in (cfg.data.train, cfg.data.valid, *cfg.data.test):
        for lang in (cfg.data.src_lang, cfg.data.tgt_lang):
            assert (data / f"{split}.{lang}").is_file()
