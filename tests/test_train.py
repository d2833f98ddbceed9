"""Training end to end (`nmt.train.fit`): what a run writes, precisions, seeds, refusing to
clobber a run, and a checkpoint that translates."""

from __future__ import annotations

import math
import time

import pytest
from train_setup import (
    metrics,
    tiny,
)

from nmt.checkpoint import load_checkpoint
from nmt.config import config_from_dict
from nmt.errors import NmtError
from nmt.train import fit


def test_fp32_run_writes_metrics_checkpoints_and_latest(tmp_path):
    cfg = tiny(tmp_path, "train.precision=fp32")
    result = fit(cfg, log=lambda _: None)
    assert result.step == 6 and result.stopped_by == "max_steps"
    rows = metrics(cfg)
    assert [r["step"] for r in rows] == list(range(1, 7))  # the last one with validation
    for row in rows:
        assert {"step", "epoch", "minutes", "loss", "lr", "tokens_per_s", "grad_norm"} <= row.keys()
        assert math.isfinite(row["loss"]) and row["tokens_per_s"] > 0
    assert "val_bleu" in rows[-1] and "val_loss" in rows[-1]
    for name in ("last.pt", "best.pt", "step-6.pt", "config.yaml"):
        assert (cfg.run_dir / name).is_file(), name
    assert (tmp_path / "runs" / "latest").resolve() == cfg.run_dir.resolve()
    state = load_checkpoint(cfg.run_dir / "last.pt")
    assert state["position"]["step"] == 6
    assert config_from_dict(state["config"]) == cfg


def test_each_metrics_row_carries_the_clocks_time_and_the_log_lines_do_not(tmp_path):
    """`time` (seconds since the epoch) lines a row up with what happened outside the run
    (compare_peers.py --interleave stops and resumes it); the progress lines, which say the
    step already, leave it out, as TensorBoard does (it keeps its own wall time)."""
    cfg = tiny(tmp_path, "train.precision=fp32")
    lines: list[str] = []
    before = time.time()
    fit(cfg, log=lines.append)
    times = [r["time"] for r in metrics(cfg)]
    assert before <= times[0] and times == sorted(times) and times[-1] <= time.time()
    steps = [line for line in lines if " step " in line and "loss=" in line]
    assert steps and not any("time=" in line for line in steps)


def test_a_run_on_the_side_leaves_runs_latest_on_the_last_one(tmp_path):
    """`run.link_latest: false` (a script's run): runs/latest still names the run before."""
    first = tiny(tmp_path, "train.max_steps=1")
    fit(first, log=lambda _: None)
    side = tiny(
        tmp_path, "train.max_steps=1", f"run.dir={tmp_path / 'side'}", "run.link_latest=false"
    )
    fit(side, log=lambda _: None)
    assert (side.run_dir / "last.pt").is_file()
    assert (tmp_path / "runs" / "latest").resolve() == first.run_dir.resolve()


def test_bf16_on_cpu_trains_and_loss_falls(tmp_path):
    cfg = tiny(tmp_path, "train.precision=bf16", "train.max_steps=40", "train.lr=0.01")
    fit(cfg, log=lambda _: None)
    losses = [r["loss"] for r in metrics(cfg) if "val_loss" not in r]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert load_checkpoint(cfg.run_dir / "last.pt")["precision"] == "bf16"


def test_same_seed_gives_identical_losses(tmp_path):
    a = tiny(tmp_path / "a")
    b = tiny(tmp_path / "b")
    fit(a, log=lambda _: None)
    fit(b, log=lambda _: None)
    assert [r["loss"] for r in metrics(a)] == [r["loss"] for r in metrics(b)]


def test_refuses_to_overwrite_an_existing_run(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=2")
    fit(cfg, log=lambda _: None)
    before = (cfg.run_dir / "last.pt").read_bytes()
    with pytest.raises(NmtError, match="--resume.*--overwrite"):
        fit(cfg, log=lambda _: None)
    assert (cfg.run_dir / "last.pt").read_bytes() == before
    fit(cfg, overwrite=True, log=lambda _: None)
    assert [r["step"] for r in metrics(cfg)] == [1, 2]  # a new metrics.jsonl, not appended


def test_a_checkpoint_written_by_fit_translates(tmp_path):
    from nmt.translate import Translator

    cfg = tiny(tmp_path, "train.max_steps=30")
    fit(cfg, log=lambda _: None)
    translator = Translator.from_checkpoint(cfg.run_dir)
    assert translator.path == cfg.run_dir / "best.pt"
    assert translator.config == cfg
    (t,) = translator.translate(["A dog runs in the park."], beam=2)
    assert t.text and t.attention.shape == (len(t.tgt_labels), len(t.src_tokens))
