"""What a training run reports: metrics.jsonl, TensorBoard, and the progress display."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nmt.config import Config
from nmt.files import atomic_write

Log = Callable[[str], None]  # where progress lines go: print, typer.echo, a list's append


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
        path = cfg.run_dir / "metrics.jsonl"
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
                if key not in ("step", "epoch") and isinstance(value, (int, float)):
                    group = "valid" if key.startswith(("val_", "avg_val_")) else "train"
                    self.writer.add_scalar(f"{group}/{key}", value, row["step"])
        parts = [f"{k}={_fmt(v)}" for k, v in row.items() if k not in ("step", "epoch")]
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


def _drop_rows_after(path: Path, step: int) -> None:
    """Keep the metrics rows up to `step` (atomically: a new file renamed over the old)."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
    if len(kept) == len(lines):
        return
    atomic_write(path, "".join(kept).encode("utf-8"))
