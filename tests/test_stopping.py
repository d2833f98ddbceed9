"""Why a run stops (`nmt.stopping`): inf/NaN updates skipped and counted, too many in a row,
validation steps, epochs, early stopping and the clock."""

from __future__ import annotations

import math

import pytest
import torch
from train_setup import (
    metrics,
    tiny,
)

from nmt.checkpoint import load_checkpoint
from nmt.errors import NmtError
from nmt.train import fit


def _nan_loss_from(monkeypatch, first_call: int, last_call: int = 10**9) -> None:
    import nmt.step

    real = nmt.step.token_loss
    calls = {"n": 0}

    def loss(output, target, smoothing):
        out = real(output, target, smoothing)
        if output.logits.requires_grad:  # training, not validation
            calls["n"] += 1
            if first_call <= calls["n"] <= last_call:
                return out * math.nan
        return out

    monkeypatch.setattr(nmt.step, "token_loss", loss)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_nan_update_is_skipped_and_counted(tmp_path, monkeypatch, precision):
    _nan_loss_from(monkeypatch, 3, 3)
    cfg = tiny(tmp_path, f"train.precision={precision}", "train.max_steps=5")
    fit(cfg, log=lambda _: None)
    rows = metrics(cfg)
    assert [r.get("skipped_steps", 0) for r in rows] == [0, 0, 1, 1, 1]
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    weights = load_checkpoint(cfg.run_dir / "last.pt")["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_too_many_bad_updates_in_a_row_stop_training(tmp_path, monkeypatch, precision):
    _nan_loss_from(monkeypatch, 3)
    cfg = tiny(
        tmp_path, f"train.precision={precision}", "train.max_bad_steps=3", "train.valid_every=1"
    )
    with pytest.raises(NmtError) as info:
        fit(cfg, log=lambda _: None)
    message = str(info.value)
    assert message.startswith("stopped at step 5: 3 updates in a row had inf/NaN")
    assert "last.pt holds step 4" in message
    assert "train.lr" in message and "clip_norm" in message and "fp32" in message
    weights = load_checkpoint(cfg.run_dir / "last.pt")["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_valid_every_validates_at_those_steps(tmp_path):
    cfg = tiny(tmp_path, "train.valid_every=2", "train.max_steps=5")
    fit(cfg, log=lambda _: None)
    assert [r["step"] for r in metrics(cfg) if "val_bleu" in r] == [2, 4, 5]  # 5: the end
    assert sorted(p.name for p in cfg.run_dir.glob("step-*.pt")) == ["step-5.pt"]  # keep_last 1


def test_max_epochs_stops_after_whole_epochs(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=0", "train.max_epochs=2")  # 6 batches an epoch
    result = fit(cfg, log=lambda _: None)
    assert (result.stopped_by, result.step, result.epoch) == ("max_epochs", 12, 2)
    assert [r["step"] for r in metrics(cfg) if "val_bleu" in r] == [6, 12]  # end of each epoch


def test_early_stopping_after_patience_validations_without_gain(tmp_path):
    # lr 0: the BLEU never improves on the first validation.
    cfg = tiny(
        tmp_path, "train.lr=0.0", "train.valid_every=1", "train.patience=2", "train.max_steps=50"
    )
    result = fit(cfg, log=lambda _: None)
    assert (result.stopped_by, result.step) == ("early stopping", 3)
    assert load_checkpoint(cfg.run_dir / "best.pt")["position"]["step"] == 1


def test_max_minutes_stops_on_the_clock(tmp_path, monkeypatch):
    import nmt.train

    clock = {"t": 1000.0}

    def monotonic() -> float:  # each reading is 6 seconds later
        clock["t"] += 6.0
        return clock["t"]

    monkeypatch.setattr(nmt.train.time, "monotonic", monotonic)
    cfg = tiny(
        tmp_path, "train.max_minutes=0.5", "train.max_steps=100", "train.save_every_minutes=null"
    )
    result = fit(cfg, log=lambda _: None)
    assert result.stopped_by == "max_minutes" and 0 < result.step < 10
    assert "val_bleu" in metrics(cfg)[-1]  # the run validates and saves before it stops
