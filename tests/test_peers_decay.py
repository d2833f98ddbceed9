"""compare_peers.py's `--decay START,EVERY,FACTOR`: one learning-rate decay for both
toolkits, OpenNMT-py's in its own options and nmt's as `train.schedule: step`; and
`--smoothing FACTOR`, one weight average for both (`average_decay`,
`train.exponential_smoothing`); each refused where it cannot apply to every row asked for."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from children import refusal
from train_setup import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from peers import common, opennmt, options  # noqa: E402

from nmt.config import load_config  # noqa: E402
from nmt.optim import lr_factor  # noqa: E402


def test_the_decay_is_the_same_schedule_in_both_toolkits(tmp_path):
    decay = options.decay("800,100,0.5")
    args = argparse.Namespace(
        decay=decay, smoothing=None, curve=0, seed=3, updates=1200, log_every=25
    )
    onmt = opennmt._config(args, tmp_path / "pieces", tmp_path / "home")
    assert (onmt["start_decay_steps"], onmt["decay_steps"], onmt["learning_rate_decay"]) == (
        800,
        100,
        0.5,
    )
    assert onmt["learning_rate"] == 0.001  # the decay scales the reference's rate
    plain = opennmt._config(argparse.Namespace(**{**vars(args), "decay": None}), Path(), Path())
    assert "start_decay_steps" not in plain  # OpenNMT-py's default (update 50,000) stays
    train = load_config(common.CONFIG, decay.nmt_set()).train
    # update n is optimizer step n - 1: OpenNMT-py's rate**((n - start + every) // every)
    factors = {n: lr_factor(train, n - 1, None) for n in (799, 800, 899, 900, 1200)}
    assert factors == {799: 1.0, 800: 0.5, 899: 0.5, 900: 0.25, 1200: 0.5**5}


@pytest.mark.parametrize(
    "args, says",
    [
        (["--decay", "800,100"], "--decay: '800,100': expected START,EVERY,FACTOR"),
        (["--decay", "800,0,0.5"], "two whole numbers >= 1 and a factor in [0, 1]"),
        (["--decay", "800,100,1.5"], "'800,100,1.5': expected START,EVERY,FACTOR"),
        (["--decay", "800,100,nan"], "'800,100,nan': expected START,EVERY,FACTOR"),
        (["--decay", "8,1,0.5"], "--decay: Joey NMT's row trains at the reference's constant"),
        (["--decay", "8,1,.5", "--only", "nmt-fp32", "--redecode"], "--decay and --redecode:"),
        (
            ["--decay", "8,1,.5", "--only", "nmt-fp32", "--nmt-set", "train.decay_every=3"],
            "--decay and --nmt-set train.decay_every=3: the schedule is set twice",
        ),
    ],
)
def test_compare_peers_refuses_a_decay_that_cannot_apply(tmp_path, args, says):
    """In one line, before any folder is made."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.en").write_text("a\n")
    work, out = tmp_path / "work", tmp_path / "out.json"
    paths = ["--data", str(tmp_path / "data"), "--work", str(work), "--out", str(out)]
    assert says in refusal(ROOT / "scripts" / "compare_peers.py", *paths, *args)
    assert not work.exists()


def test_the_smoothing_is_the_same_average_in_both_toolkits(tmp_path):
    factor = options.smoothing("1e-4")
    args = argparse.Namespace(
        decay=None, smoothing=factor, curve=0, seed=3, updates=1200, log_every=25
    )
    onmt = opennmt._config(args, tmp_path / "pieces", tmp_path / "home")
    assert onmt["average_decay"] == 1e-4 and "average_every" not in onmt  # every update
    plain = opennmt._config(argparse.Namespace(**{**vars(args), "smoothing": None}), Path(), Path())
    assert "average_decay" not in plain
    ap = argparse.ArgumentParser()
    ns = argparse.Namespace(**vars(args), again=None, only=["opennmt-py", "nmt-fp32"], nmt_set=[])
    options.check_training(ap, ns)
    train = load_config(common.CONFIG, ns.nmt_set).train
    assert train.exponential_smoothing == 1e-4 and train.schedule == "constant"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--smoothing", "0"], "--smoothing: '0': expected a factor in (0, 1]"),
        (["--smoothing", "nan"], "--smoothing: 'nan': expected a factor in (0, 1]"),
        (["--smoothing", "2"], "--smoothing: '2': expected a factor in (0, 1]"),
        (["--smoothing", "1e-4"], "--smoothing: Joey NMT's row trains without a weight average"),
        (["--smoothing", "1", "--only", "nmt-fp32", "--redecode"], "--smoothing and --redecode:"),
        (
            ["--smoothing", "1e-4", "--only", "nmt-fp32", "--nmt-set",
             "train.exponential_smoothing=0.1"],
            "--smoothing and --nmt-set train.exponential_smoothing=0.1: the average is set twice",
        ),
    ],
)  # fmt: skip
def test_compare_peers_refuses_a_smoothing_that_cannot_apply(tmp_path, args, says):
    test_compare_peers_refuses_a_decay_that_cannot_apply(tmp_path, args, says)
