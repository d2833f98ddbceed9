"""Exponential smoothing of the weights (`nmt.smoothing`, `train.exponential_smoothing`): the
average's arithmetic against a hand-written one, what validates and is saved, and resume."""

from __future__ import annotations

import pytest
import torch
from train_setup import metrics, tiny, tiny_model_and_batches

from nmt.checkpoint import load_checkpoint, load_for_inference
from nmt.smoothing import Smoothed, weight_of
from nmt.train import fit
from nmt.train_state import TRAINED_KEY


def test_the_weight_is_marians_and_opennmt_pys():
    assert weight_of(1, 1e-4) == 1.0  # the average starts as the weights
    assert weight_of(2, 1e-4) == pytest.approx(9 / 12)
    assert weight_of(100, 1e-4) == pytest.approx(9 / 110)
    assert weight_of(10**6, 1e-4) == 1e-4  # the factor alone, after 9 / factor updates
    assert weight_of(50, 0.5) == 0.5


def test_the_average_is_the_running_mean_written_out():
    _, model, _, _ = tiny_model_and_batches()
    smoothed = Smoothed(model, factor=0.01)
    g = torch.Generator().manual_seed(3)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(1, 40):
        with torch.no_grad():  # an update: every weight moves
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g))
        smoothed.update(step)
        w = weight_of(step, 0.01)
        for k, v in model.state_dict().items():
            expected[k] = (1 - w) * expected[k] + w * v
    for k, v in smoothed.model.state_dict().items():
        assert torch.allclose(v, expected[k], atol=1e-6), k
        assert not torch.equal(v, model.state_dict()[k]), k
    assert all(not p.requires_grad for p in smoothed.model.parameters())
    assert all(p.requires_grad for p in model.parameters())


def test_validation_and_checkpoints_hold_the_average_and_resume_is_exact(tmp_path):
    common = ["train.max_steps=8", "train.valid_every=4", "model.dropout=0.3"]
    smooth = "train.exponential_smoothing=0.2"
    whole = tiny(tmp_path / "whole", *common, smooth)
    fit(whole, log=lambda _: None)
    plain = tiny(tmp_path / "plain", *common)
    fit(plain, log=lambda _: None)
    saved = load_checkpoint(whole.run_dir / "last.pt")
    # The trained weights are the unsmoothed run's; "model" is their average, not them.
    trained, unsmoothed = saved[TRAINED_KEY], load_checkpoint(plain.run_dir / "last.pt")["model"]
    assert all(torch.equal(trained[k], unsmoothed[k]) for k in trained)
    assert not all(torch.equal(trained[k], saved["model"][k]) for k in trained)
    assert TRAINED_KEY not in load_checkpoint(plain.run_dir / "last.pt")
    # Validation scored the average: the same training, another validation loss.
    valid = [r for r in metrics(whole) if "val_loss" in r]
    plain_valid = [r for r in metrics(plain) if "val_loss" in r]
    assert [r["step"] for r in valid] == [4, 8]
    assert valid[-1]["val_loss"] != plain_valid[-1]["val_loss"]
    assert valid[-1]["loss"] == plain_valid[-1]["loss"]  # training loss: the trained weights
    # What decodes is the average.
    loaded = load_for_inference(whole.run_dir / "best.pt")
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, load_checkpoint(whole.run_dir / "best.pt")["model"][k]), k

    part = tiny(tmp_path / "part", *common[1:], "train.max_steps=4", smooth)
    fit(part, log=lambda _: None)
    fit(tiny(tmp_path / "part", *common, smooth), resume=True, log=lambda _: None)
    resumed = load_checkpoint(tmp_path / "part" / "run" / "last.pt")
    for key in ("model", TRAINED_KEY):
        assert all(torch.equal(saved[key][k], resumed[key][k]) for k in saved[key]), key


def test_smoothing_turned_on_or_off_on_resume_keeps_the_trained_weights(tmp_path):
    fit(tiny(tmp_path, "train.max_steps=3"), log=lambda _: None)
    last = tmp_path / "run" / "last.pt"
    before = load_checkpoint(last)["model"]
    # On: the average starts from the weights, which go on training.
    fit(tiny(tmp_path, "train.max_steps=4", "train.exponential_smoothing=0.5"), resume=True,
        log=lambda _: None)  # fmt: skip
    on = load_checkpoint(last)
    assert on["position"]["step"] == 4 and TRAINED_KEY in on
    assert not any(torch.equal(before[k], on[TRAINED_KEY][k]) for k in before if "weight" in k)
    w = weight_of(4, 0.5)  # 9/14: from step 3's weights, a step towards step 4's
    for k, v in on["model"].items():
        assert torch.allclose(v, (1 - w) * before[k] + w * on[TRAINED_KEY][k], atol=1e-6), k
    # Off: training goes on from the trained weights, not from their average.
    fit(tiny(tmp_path, "train.max_steps=4"), log=lambda _: None, resume=True)
    fit(tiny(tmp_path, "train.max_steps=5"), log=lambda _: None, resume=True)
    off = load_checkpoint(last)
    assert TRAINED_KEY not in off and off["position"]["step"] == 5
    whole = tiny(tmp_path / "whole", "train.max_steps=5")
    fit(whole, log=lambda _: None)
    expected = load_checkpoint(whole.run_dir / "last.pt")["model"]
    assert all(torch.equal(expected[k], off["model"][k]) for k in expected)
