"""The command line through Typer's CliRunner: help, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nmt.cli import app

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TINY_DATA = ROOT / "tests" / "data" / "tiny"
COMMANDS = ["check-config", "prepare", "train", "translate", "eval"]

runner = CliRunner()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NMT_DATA_DIR", raising=False)


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("error: ") for line in lines), result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_top_level_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output


def test_python_dash_m_runs_the_same_app():
    out = subprocess.run(
        [sys.executable, "-m", "nmt", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "check-config" in out.stdout


def test_check_config_prints_the_resolved_config():
    result = runner.invoke(app, ["check-config", str(TINY), "--set", "model.attention=general"])
    assert result.exit_code == 0, result.output
    assert "attention: bilinear" in result.stdout
    assert "max_len_ratio:" in result.stdout  # defaults are filled in


def test_check_config_reports_every_problem_with_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  atention: dot\n  dropout: 2\ntrain:\n  lr: fast\n")
    result = runner.invoke(app, ["check-config", str(bad)])
    assert_one_line_error(result, "model.atention", "did you mean 'attention'", "model.dropout")
    assert "train.lr: expected a number, got 'fast'" in result.stderr
    assert len(result.stderr.splitlines()) == 3


def test_bad_override_and_missing_config_exit_2(tmp_path):
    assert_one_line_error(
        runner.invoke(app, ["check-config", str(TINY), "--set", "train.max_steps=many"]),
        "train.max_steps",
    )
    assert_one_line_error(runner.invoke(app, ["check-config", "nope.yaml"]), "nope.yaml")


def test_prepare_reports_kept_pairs_and_padding(tmp_path):
    result = runner.invoke(
        app,
        ["prepare", str(TINY), "--set", f"data.dir={TINY_DATA}", "--set", f"run.dir={tmp_path}/r"],
    )
    assert result.exit_code == 0, result.output
    assert "48 kept" in result.stdout
    assert "padding" in result.stdout


def test_prepare_with_misaligned_data_is_a_one_line_error(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test"):
        (data / f"{split}.en").write_text("a\nb\nc\n")
        (data / f"{split}.fr").write_text("a\nb\nc\n")
    (data / "train.fr").write_text("a\nb\n")
    result = runner.invoke(
        app, ["prepare", str(TINY), "--set", f"data.dir={data}", "--set", f"run.dir={tmp_path}/r"]
    )
    assert_one_line_error(result, "train.en", "train.fr", "3", "2")


def test_train_then_refuse_to_clobber(tmp_path):
    args = [
        "train",
        str(TINY),
        "--set",
        f"data.dir={TINY_DATA}",
        "--set",
        f"run.dir={tmp_path}/run",
        "--set",
        "train.max_steps=3",
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "stopped by max_steps at step 3" in first.stdout
    assert_one_line_error(runner.invoke(app, args), "--resume", "--overwrite")
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0
    assert_one_line_error(runner.invoke(app, [*args, "--resume", "--overwrite"]), "exclude")
