"""Exact resume: after an interruption (a signal inside an update, a kill before the first
checkpoint), a resumed run reaches what an uninterrupted one does."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from train_setup import (
    metrics,
    tiny,
)

from nmt.checkpoint import load_checkpoint
from nmt.config import Config
from nmt.errors import NmtError
from nmt.run_dir import RunFiles
from nmt.train import fit


def test_resume_reaches_the_same_loss_as_an_uninterrupted_run(tmp_path):
    # dropout on and 3 epochs of the tiny corpus: resume must restore RNG and data order.
    common = ["train.max_steps=14", "model.dropout=0.3", "train.batch_size=16"]
    whole = tiny(tmp_path / "whole", *common)
    fit(whole, log=lambda _: None)
    part = tiny(tmp_path / "part", *common[1:], "train.max_steps=5")
    fit(part, log=lambda _: None)
    with (part.run_dir / "metrics.jsonl").open("a") as f:  # logged after last.pt, then killed
        f.write(json.dumps({"step": 6, "epoch": 1, "loss": 9.9}) + "\n")
    resumed = tiny(tmp_path / "part", *common)
    fit(resumed, resume=True, log=lambda _: None)

    def train_losses(cfg: Config) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in metrics(cfg)}

    assert train_losses(resumed)[14] == train_losses(whole)[14]
    steps = [r["step"] for r in metrics(resumed)]
    assert steps == sorted(set(steps))  # the killed run's row after step 5 is gone
    a = load_checkpoint(whole.run_dir / "last.pt")["model"]
    b = load_checkpoint(resumed.run_dir / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_model(tmp_path):
    fit(tiny(tmp_path, "train.max_steps=2"), log=lambda _: None)
    with pytest.raises(NmtError, match="model.attention"):
        fit(tiny(tmp_path, "model.attention=dot"), resume=True, log=lambda _: None)
    with pytest.raises(NmtError, match="nothing to resume"):
        fit(tiny(tmp_path / "other"), resume=True, log=lambda _: None)


def _signal_inside_update(monkeypatch, at_call: int, point: str, sig: int) -> None:
    """Make update number `at_call` receive `sig` at `point` inside it."""
    import nmt.train

    real_update = nmt.train.update
    calls = {"n": 0}

    def send(*_):
        os.kill(os.getpid(), sig)

    def update_with_signal(net, group, **kw):
        calls["n"] += 1
        if calls["n"] != at_call:
            return real_update(net, group, **kw)
        if point == "before":
            send()
        hooks = []
        if point == "forward":
            hooks.append(net.register_forward_pre_hook(lambda *_: send()))
        if point == "optimizer step":  # after the weights changed, before the step is counted
            hooks.append(kw["optimizer"].register_step_post_hook(lambda *_: send()))
        try:
            out = real_update(net, group, **kw)
        finally:
            for h in hooks:
                h.remove()
        if point == "after":
            send()
        return out

    monkeypatch.setattr(nmt.train, "update", update_with_signal)


@pytest.mark.parametrize(
    ("point", "sig"),
    [
        ("before", signal.SIGINT),
        ("forward", signal.SIGTERM),
        ("optimizer step", signal.SIGINT),
        ("after", signal.SIGTERM),
    ],
)
def test_a_signal_inside_an_update_stops_at_its_end_and_resume_is_exact(
    tmp_path, monkeypatch, point, sig
):
    common = ["train.max_steps=9", "model.dropout=0.3", "train.batch_size=16"]
    whole = tiny(tmp_path / "whole", *common)
    fit(whole, log=lambda _: None)

    part = tiny(tmp_path / "part", *common)
    with monkeypatch.context() as m:
        _signal_inside_update(m, at_call=4, point=point, sig=sig)
        lines: list[str] = []
        result = fit(part, log=lines.append, config_path="configs/tiny.yaml")
    assert result.signal == sig and result.step == 4  # the update under way was finished
    assert f"{signal.Signals(sig).name} at step 4" in lines[-1]
    assert "Resume with: nmt train configs/tiny.yaml --resume" in lines[-1]
    assert load_checkpoint(part.run_dir / "last.pt")["position"]["step"] == 4
    assert fit(part, resume=True, log=lambda _: None).step == 9
    a = load_checkpoint(whole.run_dir / "last.pt")["model"]
    b = load_checkpoint(part.run_dir / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(part)[-1]["loss"] == metrics(whole)[-1]["loss"]


def test_resuming_a_finished_run_does_nothing(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=3")
    fit(cfg, log=lambda _: None)
    before = (cfg.run_dir / "last.pt").read_bytes(), (cfg.run_dir / "metrics.jsonl").read_text()
    lines: list[str] = []
    result = fit(cfg, resume=True, log=lines.append)
    assert result.step == 3 and result.signal is None
    assert any("already finished (max_steps at step 3); nothing to do" in x for x in lines)
    after = (cfg.run_dir / "last.pt").read_bytes(), (cfg.run_dir / "metrics.jsonl").read_text()
    assert after == before
    # ... until a limit is raised: then it goes on.
    assert fit(tiny(tmp_path, "train.max_steps=5"), resume=True, log=lambda _: None).step == 5


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_over(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=4")
    fit(cfg, log=lambda _: None)
    whole = metrics(cfg)
    for p in cfg.run_dir.glob("*.pt"):  # as if killed after its first log lines
        p.unlink()
    with pytest.raises(NmtError, match="a run already exists here.*--resume"):
        fit(cfg, log=lambda _: None)
    lines: list[str] = []
    assert fit(cfg, resume=True, log=lines.append).step == 4
    assert any("no checkpoint yet" in x and "starting over" in x for x in lines)
    # wall-clock figures: the only fields that may differ
    timed = ("tokens_per_s", "minutes", "time")
    again = metrics(cfg)
    assert [{**r, **{k: again[i][k] for k in timed}} for i, r in enumerate(whole)] == again


def test_last_pt_is_also_written_every_save_every_minutes(tmp_path, monkeypatch):
    saved: list[int] = []
    real = RunFiles.save_last

    def recording(self, state):  # last.pt alone, between validations
        saved.append(state["position"]["step"])
        real(self, state)

    monkeypatch.setattr(RunFiles, "save_last", recording)
    cfg = tiny(
        tmp_path, "train.max_steps=4", "train.valid_every=100", "train.save_every_minutes=0.000001"
    )
    fit(cfg, log=lambda _: None)
    assert saved == [1, 2, 3]  # then step 4 is validated and saved with best.pt
    assert load_checkpoint(cfg.run_dir / "last.pt")["position"]["step"] == 4
