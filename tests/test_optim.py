"""Learning-rate schedules (`nmt.optim`)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nmt.config import config_from_dict
from nmt.errors import NmtError
from nmt.optim import Schedule, lr_factor


def test_schedules():
    def train_cfg(**kw):
        return config_from_dict({"train": kw}).train

    warm = train_cfg(schedule="inverse_sqrt", warmup_steps=4)
    assert [lr_factor(warm, s, None) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(warm, 15, None) == pytest.approx(0.5)
    lin = train_cfg(schedule="linear", min_lr=0.0)
    assert lr_factor(lin, 9, 10) == pytest.approx(0.0)
    cos = train_cfg(schedule="cosine")
    assert lr_factor(cos, 4, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(NmtError, match="known number of steps"):
        Schedule(lin, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), None)

    plateau = train_cfg(schedule="plateau", plateau_patience=0, plateau_factor=0.5, lr=1.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = Schedule(plateau, opt, None)
    sched.validated(10.0)
    sched.step()
    sched.validated(9.0)  # worse: halve
    sched.step()
    assert sched.lr == pytest.approx(0.5)


def test_step_decay_cuts_from_decay_start_as_opennmt_py():
    """Update decay_start is the first run at the cut rate, then every decay_every updates
    another cut (OpenNMT-py's start_decay_steps / decay_steps / learning_rate_decay), down to
    min_lr; warm-up comes first."""
    cfg = config_from_dict(
        {"train": {"schedule": "step", "decay_start": 3, "decay_every": 2, "decay_factor": 0.5}}
    ).train
    # lr_factor takes the 0-based optimizer step: update n is step n - 1
    assert [lr_factor(cfg, n - 1, None) for n in range(1, 9)] == [
        1.0,
        1.0,
        0.5,
        0.5,
        0.25,
        0.25,
        0.125,
        0.125,
    ]
    floored = dataclasses.replace(cfg, lr=1.0, min_lr=0.2)
    assert lr_factor(floored, 4, None) == 0.25 and lr_factor(floored, 7, None) == 0.2
    warm = dataclasses.replace(cfg, warmup_steps=2, decay_start=4, decay_every=1)
    assert [lr_factor(warm, n - 1, None) for n in range(1, 6)] == [0.5, 1.0, 1.0, 0.5, 0.25]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = Schedule(cfg, opt, None)  # needs no known number of updates
    rates = []
    for _ in range(5):
        rates.append(sched.lr)
        opt.step()
        sched.step()
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])
