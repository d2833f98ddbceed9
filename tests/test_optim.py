"""Learning-rate schedules (`nmt.optim`)."""

from __future__ import annotations

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
