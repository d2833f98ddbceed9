"""What a training run reports: metrics.jsonl, TensorBoard, the progress display, and the
device-side sums between two log lines (`Stats`)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nmt.config import Config
from nmt.files import FileError, atomic_write, read_back
from nmt.run_dir import METRICS_NAME

Log = Callable[[str], None]  # where progress lines go: print, typer.echo, a list's append
# a row's fields that say when it was, not what was measured: neither plotted nor printed
# (TensorBoard keeps its own wall time, and the progress line says the step and epoch)
_AXES = ("step", "epoch", "time")


class Reporter:
    """metrics.jsonl, TensorBoard scalars/images and the progress display (rank 0 only)."""

    def __init__(
        self,
        cfg: Config,
        total_steps: int | None,
        log: Log,
        *,
        enabled: bool,
        start_step: int = 0,
    ) -> None:
        """`start_step`: the step a resumed run continues from; rows logged after it by the
        interrupted run (which the resumed run will log again) are dropped."""
        self.enabled = enabled
        self.log = log
        self.metrics = None
        self.writer = None
        self.progress = None
        if not enabled:
            return
        path = cfg.run_dir / METRICS_NAME
        _drop_rows_after(path, start_step)
        self.metrics = path.open("a", encoding="utf-8")
        if cfg.run.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events an interrupted run wrote after its last checkpoint
            # (all of them when it had none: `--resume` then starts over).
            events = cfg.run_dir / "tensorboard"
            self.writer = SummaryWriter(
                str(events), purge_step=start_step + 1 if events.is_dir() else None
            )
        if sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("epoch {task.fields[epoch]} step {task.completed}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                transient=False,
            )
            self.task = self.progress.add_task("train", total=total_steps, epoch=0, info="")
            self.progress.start()

    def advance(self, step: int, epoch: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, epoch=epoch + 1)

    def record(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self.metrics is not None
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        if self.writer is not None:
            for key, value in row.items():
                if key not in _AXES and isinstance(value, (int, float)):
                    group = "valid" if key.startswith(("val_", "avg_val_")) else "train"
                    self.writer.add_scalar(f"{group}/{key}", value, row["step"])
        parts = [f"{k}={_fmt(v)}" for k, v in row.items() if k not in _AXES]
        line = " ".join(parts)
        if self.progress is not None:
            # The bar keeps to what fits a terminal line; full rows go to the log.
            short = {"loss": "loss", "tokens_per_s": "tok/s", "lr": "lr", "val_bleu": "bleu"}
            brief = [f"{name} {_fmt(row[k])}" for k, name in short.items() if k in row]
            self.progress.update(self.task, info=" | ".join(brief))
            if "val_loss" in row:
                self.progress.console.print(f"step {row['step']}: {line}")
        else:
            self.log(f"epoch {row['epoch'] + 1} step {row['step']}: {line}")

    def attention_image(self, weights: torch.Tensor, step: int) -> None:
        """The attention of a fixed validation sentence, (T, S), as a grayscale image."""
        if self.writer is not None:
            self.writer.add_image("valid/attention", weights.unsqueeze(0), step, dataformats="CHW")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self.writer is not None:
            self.writer.close()
        if self.metrics is not None:
            self.metrics.close()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metrics.jsonl as `Reporter` wrote it: one dict a row, in the order written.
    Read back as nmt's own file (`read_back`): a device or a pipe in its place is an OSError,
    never read (`/dev/zero` was read until memory was full)."""
    text = read_back(run_dir / METRICS_NAME).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _drop_rows_after(path: Path, step: int) -> None:
    """Keep the metrics rows up to `step` (atomically: a new file renamed over the old). A
    row cut short (a kill or a full disk while it was written) goes too, and each kept row
    ends its line, so that the next one is not written onto it."""
    if not os.path.lexists(path):
        return
    try:
        data = read_back(path)
    except OSError as e:
        raise FileError(
            f"{path}: not the metrics nmt writes ({e}); move it away or use a new run.dir"
        ) from None
    lines = data.splitlines(keepends=True)
    steps = [_step_of(line) for line in lines]
    kept = [
        line.rstrip(b"\n") + b"\n"
        for line, at in zip(lines, steps, strict=True)
        if at is not None and at <= step
    ]
    if kept == lines:
        return
    atomic_write(path, b"".join(kept))


def _step_of(line: bytes) -> int | None:
    """The step of a metrics row, or None for a line that is not a whole row."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if type(step) is int else None


# --------------------------------------------------------------------------- measuring


_READ = ("loss", "grad_norm", "skips", "most_skips")  # the device sums a log step reads


class Stats:
    """Running sums between two log lines, kept on the device (no sync per step) and read
    to the host in one copy (`read`) at log steps."""

    def __init__(self, device: torch.device) -> None:
        zero = torch.zeros((), device=device)
        self.loss = zero.clone()
        self.grad_norm = zero.clone()
        self.skips = zero.clone()  # updates skipped since the last read
        self.run_of_skips = zero.clone()  # ... in a row, up to now
        self.most_skips = zero.clone()  # longest such run since the last read
        self.host = dict.fromkeys(_READ, 0.0)  # what `read` brought over, until used
        self.tokens = 0
        self.updates = 0
        self.unread = False
        self.started = self.began = time.perf_counter()

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor, tokens: int) -> None:
        # A non-finite norm is exactly an update the GradScaler skipped.
        finite = torch.isfinite(grad_norm)
        self.loss += torch.where(torch.isfinite(loss), loss, 0.0)
        self.grad_norm += torch.where(finite, grad_norm, 0.0)
        self.skips += ~finite
        self.run_of_skips = (self.run_of_skips + 1) * ~finite
        torch.maximum(self.most_skips, self.run_of_skips, out=self.most_skips)
        self.tokens += tokens
        self.updates += 1
        self.unread = True

    def read(self) -> None:
        """Add the device sums to `host` in one device-to-host copy (the log step's one sync)
        and zero them; nothing to do when no update came since the last read."""
        if not self.unread:
            return
        sums = [getattr(self, name) for name in _READ]
        for name, value in zip(_READ, torch.stack(sums).tolist(), strict=True):
            self.host[name] = (
                max(self.host[name], value) if name == "most_skips" else (self.host[name] + value)
            )
        for t in sums:
            t.zero_()
        self.unread = False

    def flush(self, *, step: int, epoch: int, lr: float, skipped: int) -> dict[str, Any]:
        """Read the device-side sums (the one sync) into a metrics row and reset them;
        `epoch` is the one the last update's batches came from, `skipped` the run's count
        of updates skipped for inf/NaN gradients."""
        now = time.perf_counter()
        elapsed = now - self.started
        # minutes: wall time since this process began training (learning curves against time);
        # time: the clock's (seconds since the epoch), to line the row up with what happened
        # outside the process (a benchmark that stops and resumes it: scripts/peers/turns.py)
        row: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "lr": lr,
            "minutes": (now - self.began) / 60,
            "time": time.time(),
        }
        self.read()
        if self.updates:  # none when a resumed run validates before its first update
            row["loss"] = self.host["loss"] / max(self.tokens, 1)
            row["tokens_per_s"] = self.tokens / elapsed if elapsed > 0 else 0.0
            row["grad_norm"] = self.host["grad_norm"] / self.updates
        if skipped:
            row["skipped_steps"] = skipped
        self.host["loss"] = self.host["grad_norm"] = 0.0
        self.tokens = 0
        self.updates = 0
        self.started = time.perf_counter()
        return row
