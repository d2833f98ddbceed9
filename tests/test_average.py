"""Checkpoint averaging: `nmt average` and `train.average_last`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_setup import metrics, tiny
from typer.testing import CliRunner

from nmt.average import average_checkpoints
from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.errors import NmtError
from nmt.run_dir import AVERAGED_NAME, resolve_checkpoint
from nmt.train import fit
from nmt.translate import Translator

runner = CliRunner()


def _variant(tiny_run, tmp_path: Path, name: str, shift: float) -> Path:
    """The tiny run's checkpoint with every float weight moved by `shift`."""
    state = load_checkpoint(tiny_run.checkpoint)
    state["model"] = {
        k: v + shift if v.is_floating_point() else v for k, v in state["model"].items()
    }
    save_checkpoint(state, tmp_path / name)
    return tmp_path / name


def test_the_average_of_two_checkpoints_has_the_mean_weights(tiny_run, tmp_path):
    a = _variant(tiny_run, tmp_path, "a.pt", 0.0)
    b = _variant(tiny_run, tmp_path, "b.pt", 0.5)
    # b's weights are a's moved by 0.5 and then scaled per tensor, so the mean is not trivial
    state = load_checkpoint(b)
    state["model"] = {k: v * 3 if v.is_floating_point() else v for k, v in state["model"].items()}
    save_checkpoint(state, b)
    wa, wb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    averaged = average_checkpoints([a, b])
    assert averaged["model"].keys() == wa.keys()
    for k, v in averaged["model"].items():
        assert v.dtype == wa[k].dtype
        if v.is_floating_point():
            torch.testing.assert_close(v, (wa[k] + wb[k]) / 2)
    assert averaged["averaged_from"] == [str(a), str(b)]


def test_cli_average_writes_a_checkpoint_that_translates(tiny_run, tmp_path):
    a = _variant(tiny_run, tmp_path, "a.pt", 0.0)
    b = _variant(tiny_run, tmp_path, "b.pt", 0.0)
    out = tmp_path / "avg.pt"
    result = runner.invoke(app, ["average", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    # the mean of two copies is the model itself: same translations
    same = Translator.from_checkpoint(out).translate([tiny_run.train_src[0]], beam=2)
    ref = Translator.from_checkpoint(a).translate([tiny_run.train_src[0]], beam=2)
    assert same[0].text == ref[0].text and same[0].score == pytest.approx(ref[0].score)
    again = runner.invoke(app, ["average", str(a), str(b), "-o", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["RUN"], "add --last N"),
        (["RUN", "--last", "9"], "cannot average the last 9"),
        (["A", "--last", "2"], "goes with one run directory"),
        (["A", "OTHER"], "a different model config"),
        (["A", "missing.pt"], "missing.pt: no such checkpoint file"),
        (["A", "A", "-o", "out.txt"], "ending .pt"),
    ],
)
def test_cli_average_errors_are_one_line(tiny_run, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "RUN"
    run.mkdir()
    for step in (10, 20):
        _variant(tiny_run, run, f"step-{step}.pt", 0.0)
    _variant(tiny_run, tmp_path, "A", 0.0)
    other = load_checkpoint(tmp_path / "A")
    other["config"]["model"]["dropout"] = 0.5
    save_checkpoint(other, tmp_path / "OTHER")
    argv = ["average", *args] + ([] if "-o" in args else ["-o", "out.pt"])
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "out.pt").exists()


def _fake_validation(monkeypatch, bleus: list[float]) -> None:
    """validate() gives these val BLEUs in turn (the last one: the averaged model's)."""
    import nmt.train

    given = iter(bleus)

    def fake(*_args, **_kwargs) -> dict[str, float]:
        return {"val_loss": 1.0, "val_ppl": 2.7, "val_bleu": next(given)}

    monkeypatch.setattr(nmt.train, "validate", fake)


def _averaged_run(tmp_path: Path):
    return tiny(
        tmp_path,
        "train.max_steps=6",
        "train.valid_every=2",
        "train.average_last=3",
        "train.keep_last=3",
    )


def test_average_last_at_the_end_of_training_is_what_the_run_translates_with(tmp_path, monkeypatch):
    _fake_validation(monkeypatch, [10.0, 20.0, 30.0, 30.0])  # as good as the best: kept
    cfg = _averaged_run(tmp_path)
    fit(cfg, log=lambda _: None)
    steps = [cfg.run_dir / f"step-{s}.pt" for s in (2, 4, 6)]
    averaged = load_checkpoint(cfg.run_dir / AVERAGED_NAME)
    torch.testing.assert_close(averaged["model"], average_checkpoints(steps)["model"])
    assert resolve_checkpoint(cfg.run_dir) == cfg.run_dir / AVERAGED_NAME
    assert metrics(cfg)[-1]["avg_val_bleu"] == 30.0


def test_an_average_worse_than_the_best_checkpoint_is_not_kept(tmp_path, monkeypatch):
    _fake_validation(monkeypatch, [10.0, 30.0, 20.0, 29.0])
    cfg = _averaged_run(tmp_path)
    said: list[str] = []
    fit(cfg, log=said.append)
    assert not (cfg.run_dir / AVERAGED_NAME).exists()
    assert resolve_checkpoint(cfg.run_dir) == cfg.run_dir / "best.pt"
    assert metrics(cfg)[-1]["avg_val_bleu"] == 29.0
    assert any("below the best checkpoint's bleu (30.00): not kept" in line for line in said)


def test_average_last_with_one_step_checkpoint_writes_nothing(tmp_path, monkeypatch):
    _fake_validation(monkeypatch, [10.0])  # one validation; a second call would fail
    cfg = tiny(
        tmp_path,
        "train.max_steps=2",
        "train.valid_every=2",
        "train.average_last=3",
        "train.keep_last=3",
    )
    said: list[str] = []
    fit(cfg, log=said.append)
    assert not (cfg.run_dir / AVERAGED_NAME).exists()
    assert any("1 step checkpoint(s), nothing to average" in line for line in said)


def test_average_last_above_keep_last_is_a_config_error(tmp_path):
    with pytest.raises(NmtError, match="train.keep_last"):
        tiny(tmp_path, "train.average_last=4", "train.keep_last=3")
