"""What a training checkpoint holds, and how a run is set up, saved and restored.

`TrainState` keeps the three side by side, so that a reader can check at a glance that
everything saved is restored: the model, optimizer, schedule, scaler, the position in the
data order and the RNG states. Resuming may change how training goes on, not what is
trained (`check_resumable`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.config import Config, config_from_dict
from nmt.errors import NmtError
from nmt.model import Seq2Seq, build_model
from nmt.optim import Schedule, build_optimizer
from nmt.run_dir import LAST_NAME
from nmt.runtime import Precision
from nmt.shortlist import Shortlist
from nmt.smoothing import Smoothed
from nmt.step import make_scaler
from nmt.tokenizer import Tokenizer

# The weights the optimizer updates, saved beside "model" where that holds their running
# average (`train.exponential_smoothing`): decoding reads "model", resuming both.
TRAINED_KEY = "trained"


@dataclass
class Position:
    """Where training stands; everything needed to continue exactly."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # this rank's batches of `epoch` already consumed
    best_score: float | None = None
    bad_validations: int = 0  # validations since the best one, for early stopping
    skipped_steps: int = 0  # updates skipped for inf/NaN gradients, in all


@dataclass
class TrainState:
    """Everything a checkpoint holds: how it is set up, saved and restored, side by side."""

    cfg: Config
    tokenizer: Tokenizer
    model: Seq2Seq
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scaler: torch.amp.GradScaler
    pos: Position
    device: torch.device
    precision: Precision
    shortlist: Shortlist | None = None  # decoding's (`nmt.shortlist`), built from the data
    smoothed: Smoothed | None = None  # the weights' running average (train.exponential_smoothing)

    @property
    def evaluated(self) -> Seq2Seq:
        """The model that validates and is saved for decoding: the average where there is one."""
        return self.smoothed.model if self.smoothed is not None else self.model

    @classmethod
    def build(
        cls,
        cfg: Config,
        tokenizer: Tokenizer,
        device: torch.device,
        precision: Precision,
        total_steps: int | None,
    ) -> TrainState:
        """A fresh model and optimizer at step 0 (the weights drawn from the seeded RNG)."""
        model = build_model(
            cfg.model,
            src_vocab_size=tokenizer.src_vocab_size,
            tgt_vocab_size=tokenizer.tgt_vocab_size,
            shared_vocab=tokenizer.joint,
        ).to(device)
        optimizer = build_optimizer(cfg.train, model.parameters())
        factor = cfg.train.exponential_smoothing
        return cls(
            cfg=cfg,
            tokenizer=tokenizer,
            model=model,
            optimizer=optimizer,
            schedule=Schedule(cfg.train, optimizer, total_steps),
            scaler=make_scaler(device, precision),
            pos=Position(),
            device=device,
            precision=precision,
            smoothed=Smoothed(model, factor) if factor > 0 else None,
        )

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint holds: enough to translate (config, tokenizer, weights) and to
        continue exactly (optimizer, schedule, scaler, position in the data, RNG states).
        With exponential smoothing, "model" is the average (what decodes) and "trained" the
        weights the optimizer updates."""
        return {
            "config": self.cfg.to_dict(),
            "tokenizer": self.tokenizer.to_bytes(),
            "vocab": {"src": self.tokenizer.src_vocab_size, "tgt": self.tokenizer.tgt_vocab_size},
            "model": self.evaluated.state_dict(),
            **({TRAINED_KEY: self.model.state_dict()} if self.smoothed is not None else {}),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "position": self.pos.__dict__.copy(),
            "rng": _rng_state(self.device),
            "precision": self.precision,
            **({"shortlist": self.shortlist.to_state()} if self.shortlist else {}),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Put back what `checkpoint` saved (the config and tokenizer are checked, not set).
        Smoothing may be turned on or off on resume: an average starts from the weights."""
        self.model.load_state_dict(saved.get(TRAINED_KEY, saved["model"]))
        if self.smoothed is not None:
            self.smoothed.model.load_state_dict(saved["model"])  # the average, or the weights
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        if scaler_carries_over(saved.get("precision"), self.precision) and saved["scaler"]:
            self.scaler.load_state_dict(saved["scaler"])  # (empty from a disabled scaler)
        self.pos = Position(**saved["position"])
        _set_rng_state(saved["rng"], self.device)


def scaler_carries_over(saved_precision: str | None, precision: Precision) -> bool:
    """Whether a checkpoint's GradScaler state is restored: only fp16 -> fp16. A bf16 or
    fp32 run's scaler is pinned at 1.0 (growing every 2,000 steps): an fp16 run resumed from
    it (H100 -> T4 with `auto`) would train for thousands of updates with underflowing
    gradients, so it starts from `make_scaler`'s 2^16 instead; and an fp16 scale resumed in
    bf16/fp32 would divide gradients that were never scaled."""
    return saved_precision == "fp16" and precision == "fp16"


def _rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# What `TrainState.checkpoint` writes beyond the weights: a checkpoint without them (`nmt
# average`'s output, a hand-made file) cannot continue a run.
RESUME_KEYS = ("optimizer", "schedule", "scaler", "position", "rng")


def check_resumable(cfg: Config, saved: dict[str, Any], run_dir: Path) -> None:
    """Resuming may change how training goes on (lr, steps, ...), not what is trained."""
    missing = [k for k in RESUME_KEYS if k not in saved]
    if missing:
        raise NmtError(
            f"{run_dir / LAST_NAME}: cannot resume: it holds no {', '.join(missing)} (weights "
            "only, as `nmt average` writes); use another run.dir or --overwrite"
        )
    old = config_from_dict(saved["config"])
    for section in ("model", "tokenizer", "data"):
        if getattr(old, section) != getattr(cfg, section):
            a, b = getattr(old, section).__dict__, getattr(cfg, section).__dict__
            diffs = [f"{section}.{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k]]
            raise NmtError(
                f"{run_dir}: cannot resume with a different {section} config "
                f"({'; '.join(diffs)}); use another run.dir or --overwrite"
            )
