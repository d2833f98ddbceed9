"""What a training checkpoint holds (`nmt.train_state`): saved and restored side by side, and
what a resume may change."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nmt.errors import NmtError
from nmt.tokenizer import Tokenizer
from nmt.train_state import RESUME_KEYS, Position, TrainState, check_resumable

CPU = torch.device("cpu")


def _state(tiny_run, seed: int) -> TrainState:
    torch.manual_seed(seed)
    tokenizer = Tokenizer.load(tiny_run.run_dir)
    return TrainState.build(tiny_run.config, tokenizer, CPU, "fp32", total_steps=10)


def test_restore_puts_back_weights_optimizer_position_and_random_state(tiny_run):
    first = _state(tiny_run, seed=1)
    first.pos = Position(step=7, epoch=2, batch_in_epoch=3, best_score=12.5)
    saved = first.checkpoint()
    expected_draw = torch.rand(3)  # what the run would draw next
    second = _state(tiny_run, seed=2)
    assert not torch.equal(
        next(iter(first.model.state_dict().values())),
        next(iter(second.model.state_dict().values())),
    )
    second.restore(saved)
    for k, v in first.model.state_dict().items():
        assert torch.equal(v, second.model.state_dict()[k]), k
    assert second.pos == first.pos
    assert (
        second.optimizer.state_dict()["param_groups"]
        == first.optimizer.state_dict()["param_groups"]
    )
    assert torch.equal(torch.rand(3), expected_draw)
    assert set(RESUME_KEYS) <= set(saved)


def test_a_resume_may_change_how_training_goes_on_not_what_is_trained(tiny_run, tmp_path):
    saved = _state(tiny_run, seed=1).checkpoint()
    cfg = tiny_run.config
    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=5e-4, max_steps=99))
    check_resumable(longer, saved, tmp_path)  # no error
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention="dot"))
    with pytest.raises(NmtError, match=r"different model config \(model.attention: "):
        check_resumable(other, saved, tmp_path)
    weights_only = {k: v for k, v in saved.items() if k not in ("optimizer", "rng")}
    with pytest.raises(NmtError, match="cannot resume: it holds no optimizer, rng"):
        check_resumable(cfg, weights_only, tmp_path)
