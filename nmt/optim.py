"""Optimizer and learning-rate schedule built from `TrainConfig`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from nmt.config import TrainConfig
from nmt.errors import NmtError


def build_optimizer(
    cfg: TrainConfig, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """Adam or AdamW with the fused kernel: one step over all parameters at once, on the CPU
    as on the GPU (about 6x faster than the per-tensor loop for 12 M parameters here)."""
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)


def lr_factor(cfg: TrainConfig, step: int, total_steps: int | None) -> float:
    """The multiple of `cfg.lr` at optimizer step `step` (0-based) for step-wise schedules."""
    warmup = cfg.warmup_steps
    n = step + 1
    if warmup and n <= warmup:
        return n / warmup
    if cfg.schedule in ("constant", "plateau"):
        return 1.0
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / n)
    floor = cfg.min_lr / cfg.lr if cfg.lr else 0.0
    if cfg.schedule == "step":  # update decay_start is the first one cut (as OpenNMT-py's)
        cuts = (n - cfg.decay_start) // cfg.decay_every + 1 if n >= cfg.decay_start else 0
        return max(floor, cfg.decay_factor**cuts)
    assert total_steps is not None  # checked by Schedule
    progress = min(1.0, (n - warmup) / max(1, total_steps - warmup))
    if cfg.schedule == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


class Schedule:
    """A step-wise LambdaLR, plus ReduceLROnPlateau on the validation score when asked.

    `step()` after every optimizer step; `validated(score)` after every validation, with
    a score where higher is better.
    """

    def __init__(
        self, cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int | None
    ) -> None:
        if cfg.schedule in ("linear", "cosine") and not total_steps:
            raise NmtError(
                f"train.schedule: {cfg.schedule!r} decays over a known number of steps; "
                "set train.max_steps or train.max_epochs"
            )
        self.step_wise = LambdaLR(optimizer, lambda s: lr_factor(cfg, s, total_steps))
        self.plateau = (
            ReduceLROnPlateau(
                optimizer,
                mode="max",
                factor=cfg.plateau_factor,
                patience=cfg.plateau_patience,
                min_lr=cfg.min_lr,
            )
            if cfg.schedule == "plateau"
            else None
        )
        self.optimizer = optimizer
        self.warmup_steps = cfg.warmup_steps

    def step(self) -> None:
        # Under `plateau`, LambdaLR only warms up; after that it would overwrite the cuts.
        if self.plateau is None or self.step_wise.last_epoch < self.warmup_steps:
            self.step_wise.step()

    def validated(self, score: float) -> None:
        if self.plateau is not None:
            self.plateau.step(score)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:
        return {
            "step_wise": self.step_wise.state_dict(),
            "plateau": self.plateau.state_dict() if self.plateau is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_wise.load_state_dict(state["step_wise"])
        if self.plateau is not None and state["plateau"] is not None:
            self.plateau.load_state_dict(state["plateau"])
