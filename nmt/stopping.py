"""Why a training run stops: its position (steps, epochs, early stopping), what comes from
outside (Ctrl-C, SIGTERM, the time budget; agreed by every process under DDP), and runs of
updates skipped for inf/NaN gradients. Checked between updates, never inside one, so that a
checkpoint always holds a state an uninterrupted run passes through.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nmt.config import TrainConfig
from nmt.errors import NmtError
from nmt.report import Stats
from nmt.runtime import Distributed, StopSignals
from nmt.train_state import Position


def stop_reason(pos: Position, tc: TrainConfig) -> str:
    """Why the run must take no further update, from its position alone ("" = go on).

    The same on every process, so it needs no agreement under DDP. Checked before every
    update, so that a finished run, resumed, does nothing.
    """
    if tc.max_steps and pos.step >= tc.max_steps:
        return "max_steps"
    if tc.max_epochs and pos.epoch >= tc.max_epochs:
        return "max_epochs"
    if tc.patience and pos.bad_validations >= tc.patience:
        return "early stopping"
    return ""


def outside_reason(
    signals: StopSignals, tc: TrainConfig, minutes: float, ctx: Distributed, device: torch.device
) -> str:
    """Why to stop that comes from outside the run: a signal, or this invocation's time
    budget (`train.max_minutes`). Under DDP the processes agree (any rank's signal, rank 0's
    clock), which costs a host sync: the loop asks only at log steps then."""
    sig = signals.received or 0
    over = int(tc.max_minutes is not None and minutes >= tc.max_minutes)
    if ctx.enabled:
        both = torch.tensor([sig, over if ctx.is_main else 0], device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        sig, over = (int(x) for x in both.tolist())
        if sig and signals.received is None:
            signals.received = sig
    if sig:
        return signals.name
    return "max_minutes" if over else ""


def check_bad_steps(stats: Stats, pos: Position, tc: TrainConfig, saved: str) -> None:
    """Count the updates skipped for inf/NaN gradients; stop when too many come in a row.

    Reads device counters, so it runs at log steps only. `saved` says where the last good
    checkpoint is: a skipped update leaves the weights untouched, so nothing bad was saved.
    """
    stats.read()
    most, skips = int(stats.host["most_skips"]), int(stats.host["skips"])
    pos.skipped_steps += skips
    stats.host["skips"] = stats.host["most_skips"] = 0.0
    if most >= tc.max_bad_steps:
        raise NmtError(
            f"stopped at step {pos.step}: {most} updates in a row had inf/NaN loss or gradients "
            f"and were skipped (train.max_bad_steps {tc.max_bad_steps}); {saved}. Try a lower "
            "train.lr, a train.clip_norm, or train.precision fp32"
        )
