"""The documentation that is generated stays generated: docs/configuration.md's table of
every key is what scripts/config_reference.py makes from nmt/config.py. And the map of the
code (docs/architecture.md) names every module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nmt.config import ConfigError, config_from_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from config_reference import DOC, render, table  # noqa: E402


def test_the_configuration_reference_is_generated_from_the_dataclasses():
    text = DOC.read_text(encoding="utf-8")
    assert render(text) == text, "docs/configuration.md is stale: run scripts/config_reference.py"


def test_every_config_key_has_a_help_in_the_reference():
    for row in table().splitlines():
        if row.startswith("| `"):
            assert row.rstrip(" |").split("|")[-1].strip(), f"no help: {row}"


def test_the_architecture_map_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = sorted(p.name for p in (ROOT / "nmt").glob("*.py") if not p.name.startswith("__"))
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_reference_writes_each_range_as_the_range_messages_do():
    # One writer (`nmt.typed.bound`) for both: the reference said `>= 0.0` where a value out
    # of range was told `is below the minimum 0`.
    rows = {
        r.split("|")[1].strip(" `"): r.split("|")[4].strip()
        for r in table().splitlines()
        if r.startswith("| `")
    }
    assert rows["model.dropout"] == ">= 0, <= 0.95"
    assert rows["data.max_len_ratio"] == ">= 1"
    assert rows["model.init_range"] == "> 0"
    assert not [r for r in rows.values() if ".0," in r + ","], "a whole bound written as x.0"
    with pytest.raises(ConfigError) as info:
        config_from_dict({"model": {"dropout": -0.5}}, [])
    assert info.value.problems == ["model.dropout: -0.5 is below the minimum 0"]
