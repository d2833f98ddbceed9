"""Training: `fit(cfg)` runs one readable loop from a config to checkpoints.

The loop: batches bucketed by length (reshuffled each epoch, reproducible from the seed);
one update per group of accumulated batches (`nmt.step`); validation (loss, perplexity,
greedy BLEU) with best/last checkpoints; early stopping; metrics to `metrics.jsonl` and
TensorBoard. Every stop condition is checked before an update, never inside one: Ctrl-C
and SIGTERM, the step/epoch/time budgets, early stopping. So a checkpoint always holds a
state that an uninterrupted run passes through, and resuming it is exact.

Nothing in a step forces a host-device sync: the loss, token counts, gradient norm and
skipped-update counts stay on the device until a logging step reads them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nmt.average import step_checkpoints, write_average
from nmt.batching import collate, epoch_rows
from nmt.checkpoint import (
    AVERAGED_NAME,
    RunFiles,
    load_checkpoint,
    point_latest_at,
    save_checkpoint,
)
from nmt.config import Config, TrainConfig
from nmt.data import Prepared, prepare
from nmt.errors import NmtError
from nmt.files import atomic_write
from nmt.report import Log, Reporter
from nmt.runtime import (
    Distributed,
    StopSignals,
    configure_device,
    init_distributed,
    rank_seed,
    resolve_device,
    resolve_precision,
    seed_everything,
    shutdown_distributed,
)
from nmt.step import update
from nmt.train_state import Position, TrainState, check_resumable
from nmt.validation import attention_of, validate

# --------------------------------------------------------------------------- stopping


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


# --------------------------------------------------------------------------- the loop


@dataclass
class FitResult:
    run_dir: Path
    step: int
    epoch: int
    best_score: float | None
    stopped_by: str  # max_steps, max_epochs, max_minutes, early stopping, SIGINT, SIGTERM, ...
    signal: int | None = None  # the signal that stopped it: exit with 128 + signal


def fit(
    cfg: Config,
    *,
    resume: bool = False,
    overwrite: bool = False,
    log: Log = print,
    config_path: str | None = None,
) -> FitResult:
    """Train the model `cfg` describes; returns where training ended and why."""
    ctx = init_distributed(cfg.train.device, cfg.train.dist_timeout_minutes)
    log = log if ctx.is_main else _quiet
    try:
        with StopSignals(log) as signals:
            return _fit(
                cfg,
                ctx,
                signals,
                resume=resume,
                overwrite=overwrite,
                log=log,
                config_path=config_path,
            )
    finally:
        shutdown_distributed(ctx)


def _quiet(_: str) -> None:
    pass


def _fit(
    cfg: Config,
    ctx: Distributed,
    signals: StopSignals,
    *,
    resume: bool,
    overwrite: bool,
    log: Log,
    config_path: str | None,
) -> FitResult:
    tc = cfg.train
    device = resolve_device(tc.device, ctx.local_rank, distributed=ctx.enabled)
    precision = resolve_precision(tc.precision, device)
    configure_device(device, tc.threads)
    run = RunFiles(cfg.run_dir, tc.keep_last)
    # Known before claiming (which never makes one), and the same on every rank.
    has_checkpoint = resume and (cfg.run_dir / "last.pt").is_file()
    if ctx.is_main:
        run.claim(resume=resume, overwrite=overwrite)
        atomic_write(cfg.run_dir / "config.yaml", cfg.to_yaml().encode("utf-8"))
        if resume and not has_checkpoint:
            log(f"{cfg.run_dir}: no checkpoint yet (stopped before its first); starting over")
    ctx.barrier()
    saved = load_checkpoint(cfg.run_dir / "last.pt") if has_checkpoint else None
    if saved is not None:
        check_resumable(cfg, saved, cfg.run_dir)
    seed_everything(tc.seed)

    if not ctx.is_main:
        ctx.barrier()  # rank 0 trains the tokenizer and fills the cache first
    prepared = prepare(cfg, log=log)
    if ctx.is_main:
        for line in prepared.report_lines():
            log(line)
        ctx.barrier()
    train = prepared.train
    src_lens = [len(s) for s in train.src_ids]
    tgt_lens = [len(t) for t in train.tgt_ids]

    def epoch_batches(epoch: int) -> list[list[int]]:
        return epoch_rows(src_lens, tgt_lens, tc, epoch, rank=ctx.rank, world=ctx.world)

    updates_per_epoch = math.ceil(len(epoch_batches(0)) / tc.accum_steps)
    total_steps = tc.max_steps or (tc.max_epochs * updates_per_epoch if tc.max_epochs else None)
    ts = TrainState.build(cfg, prepared.tokenizer, device, precision, total_steps)
    if saved is not None:
        ts.restore(saved)
        log(f"resuming {cfg.run_dir} at step {ts.pos.step} (epoch {ts.pos.epoch + 1})")
    pos, model = ts.pos, ts.model
    net: nn.Module = model
    if ctx.enabled:
        # device_ids=None: the batches are on the device already; with device_ids DDP would
        # move src_lens (CPU, for packing) to the GPU and the model would copy it back.
        net = nn.parallel.DistributedDataParallel(model, device_ids=None)
        if not ctx.is_main:  # each rank its own dropout masks
            torch.manual_seed(rank_seed(tc.seed, ctx.rank, pos.step))
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"model: {n_params:,} parameters; device {device}, precision {precision}"
        + (f", {ctx.world} processes" if ctx.enabled else "")
    )

    reporter = Reporter(cfg, total_steps, log, enabled=ctx.is_main, start_step=pos.step)
    stats = Stats(device)
    started = last_saved = time.monotonic()
    saved_at: int | None = pos.step if saved is not None else None
    validated_at = pos.step if saved is not None else -1  # a resumed run goes on first

    def minutes() -> float:
        return (time.monotonic() - started) / 60

    batches = epoch_batches(pos.epoch)
    if pos.batch_in_epoch >= len(batches):  # saved at the very end of an epoch
        pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
        batches = epoch_batches(pos.epoch)
    # Every stop condition is checked before an update: here for the first one, and at the
    # end of each update for the next one. A finished run, resumed, does nothing.
    stopped_by = stop_reason(pos, tc) or outside_reason(signals, tc, minutes(), ctx, device)
    finished_before = bool(stopped_by) and saved is not None
    net.train()
    try:
        while not stopped_by:
            epoch = pos.epoch
            rows = batches[pos.batch_in_epoch : pos.batch_in_epoch + tc.accum_steps]
            group = [
                collate([train.src_ids[r] for r in b], [train.tgt_ids[r] for r in b], b).to(
                    device, non_blocking=True
                )
                for b in rows
            ]
            loss, grad_norm = update(
                net,
                group,
                optimizer=ts.optimizer,
                scaler=ts.scaler,
                device=device,
                precision=precision,
                label_smoothing=tc.label_smoothing,
                clip_norm=tc.clip_norm,
                world=ctx.world,
            )
            ts.schedule.step()
            pos.step += 1
            pos.batch_in_epoch += len(rows)
            stats.add(loss, grad_norm, sum(b.n_tgt_tokens for b in group))
            reporter.advance(pos.step, epoch)
            end_of_epoch = pos.batch_in_epoch >= len(batches)
            if end_of_epoch:
                pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
                batches = epoch_batches(pos.epoch)

            log_now = pos.step % tc.log_every == 0
            stopped_by = stop_reason(pos, tc)
            if not ctx.enabled or log_now:  # under DDP agreeing costs a sync: log steps only
                stopped_by = stopped_by or outside_reason(signals, tc, minutes(), ctx, device)
            by_signal = bool(stopped_by) and stopped_by == signals.name  # agreed by all ranks
            validate_now = (stopped_by and not by_signal) or (
                pos.step % tc.valid_every == 0 if tc.valid_every else end_of_epoch
            )
            if log_now or validate_now:
                where = f"last.pt holds step {saved_at}" if saved_at is not None else "none saved"
                check_bad_steps(stats, pos, tc, where)
            if validate_now:
                _validate_and_save(ts, prepared, run, reporter, stats, ctx, epoch)
                validated_at = saved_at = pos.step
                last_saved = time.monotonic()
                stopped_by = stopped_by or stop_reason(pos, tc)  # early stopping
            elif log_now:
                reporter.record(_flush(stats, pos, epoch, ts.schedule.lr))
            minutes_unsaved = (time.monotonic() - last_saved) / 60
            every = tc.save_every_minutes
            if every is not None and minutes_unsaved >= every and not by_signal:
                if ctx.is_main:  # last.pt only: best.pt and step-N.pt come with validation
                    save_checkpoint(ts.checkpoint(), run.dir / "last.pt")
                saved_at, last_saved = pos.step, time.monotonic()
            if not ctx.enabled and not stopped_by and signals.received is not None:
                stopped_by = signals.name  # it came during validation: no update starts now

        if stopped_by == signals.name:
            if ctx.is_main:
                save_checkpoint(ts.checkpoint(), run.dir / "last.pt")
                log(
                    f"{stopped_by} at step {pos.step}: saved {run.dir / 'last.pt'}. "
                    f"Resume with: nmt train {config_path or 'CONFIG'} --resume"
                )
            return FitResult(
                run.dir, pos.step, pos.epoch, pos.best_score, stopped_by, signals.received
            )
        if finished_before:
            log(f"{run.dir}: already finished ({stopped_by} at step {pos.step}); nothing to do")
        elif validated_at != pos.step:  # stopped before its first update
            _validate_and_save(ts, prepared, run, reporter, stats, ctx, pos.epoch)
        if tc.average_last and ctx.is_main:
            _average_last(ts, prepared, run, reporter, log)
    finally:
        reporter.close()
    if ctx.is_main:
        not_linked = point_latest_at(cfg.run_dir)
        if not_linked:
            log(f"warning: {not_linked}")
        best = f"{pos.best_score:.2f}" if pos.best_score is not None else "-"
        log(
            f"stopped by {stopped_by} at step {pos.step} ({pos.epoch} full epochs); "
            f"best {tc.valid_metric}: {best}; checkpoints in {cfg.run_dir}"
        )
    return FitResult(cfg.run_dir, pos.step, pos.epoch, pos.best_score, stopped_by)


def _validate_and_save(
    ts: TrainState,
    prepared: Prepared,
    run: RunFiles,
    reporter: Reporter,
    stats: Stats,
    ctx: Distributed,
    epoch: int,
) -> None:
    """Validate on rank 0 and share its score, so that every rank takes the same decisions
    (the plateau schedule's learning rate, the best score, early stopping); then rank 0
    records the row and saves last (and best) checkpoints. With a learning rate cut on rank 0
    alone, DDP would average gradients that each rank applies at its own rate, and the
    replicas would drift apart."""
    pos, tc = ts.pos, ts.cfg.train
    row: dict[str, Any] = {}
    score = 0.0
    if ctx.is_main:
        row = _flush(stats, pos, epoch, ts.schedule.lr)
        scores = validate(ts.model, prepared, ts.cfg, ts.device, ts.precision)
        row.update(scores)
        score = scores["val_bleu"] if tc.valid_metric == "bleu" else -scores["val_loss"]
    if ctx.enabled:
        shared = torch.tensor([score], dtype=torch.float64, device=ts.device)
        dist.broadcast(shared, src=0)
        score = float(shared.item())
    ts.schedule.validated(score)
    improved = pos.best_score is None or score > pos.best_score
    if improved:
        pos.best_score, pos.bad_validations = score, 0
    else:
        pos.bad_validations += 1
    if ctx.is_main:
        reporter.record(row)
        if len(prepared.valid.src_ids):
            sample = prepared.valid.src_ids[0]
            image = attention_of(ts.model, sample, ts.cfg.decode, ts.device)
            reporter.attention_image(image, pos.step)
        run.save(ts.checkpoint(), step=pos.step, best=improved)


def _average_last(
    ts: TrainState, prepared: Prepared, run: RunFiles, reporter: Reporter, log: Log
) -> None:
    """Write averaged.pt, the mean of the last `train.average_last` step checkpoints, and
    validate it against the best single checkpoint: kept where it is at least as good (a run
    directory translates with it first), removed otherwise. Training is over: the model is
    reused."""
    tc = ts.cfg.train
    paths = step_checkpoints(run.dir)[-tc.average_last :]
    path = run.dir / AVERAGED_NAME
    if len(paths) < 2:  # the mean of one checkpoint is that checkpoint: nothing to gain
        log(f"train.average_last: {len(paths)} step checkpoint(s), nothing to average")
        return
    averaged = write_average(paths, path)
    ts.model.load_state_dict(averaged["model"])
    scores = validate(ts.model, prepared, ts.cfg, ts.device, ts.precision)
    averaged_scores = {f"avg_{k}": v for k, v in scores.items()}
    reporter.record(
        {"step": ts.pos.step, "epoch": ts.pos.epoch, "averaged": len(paths), **averaged_scores}
    )
    steps = ", ".join(p.stem.split("-")[1] for p in paths)
    score = scores["val_bleu"] if tc.valid_metric == "bleu" else -scores["val_loss"]
    best = ts.pos.best_score
    said = (
        f"the mean of steps {steps}: val BLEU {scores['val_bleu']:.2f}, "
        f"loss {scores['val_loss']:.3f}"
    )
    if best is not None and score < best:
        path.unlink()
        log(
            f"{path}: {said}, below the best checkpoint's {tc.valid_metric} "
            f"({abs(best):.2f}): not kept, the run translates with best.pt"
        )
    else:
        log(f"{path}: {said} (the run translates with it)")


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


def _flush(stats: Stats, pos: Position, epoch: int, lr: float) -> dict[str, Any]:
    """Read the device-side sums (the one sync) into a metrics row and reset them; `epoch`
    is the one the last update's batches came from."""
    now = time.perf_counter()
    elapsed = now - stats.started
    # minutes: wall time since this process began training (learning curves against time)
    row: dict[str, Any] = {
        "step": pos.step,
        "epoch": epoch,
        "lr": lr,
        "minutes": (now - stats.began) / 60,
    }
    stats.read()
    if stats.updates:  # none when a resumed run validates before its first update
        row["loss"] = stats.host["loss"] / max(stats.tokens, 1)
        row["tokens_per_s"] = stats.tokens / elapsed if elapsed > 0 else 0.0
        row["grad_norm"] = stats.host["grad_norm"] / stats.updates
    if pos.skipped_steps:
        row["skipped_steps"] = pos.skipped_steps
    stats.host["loss"] = stats.host["grad_norm"] = 0.0
    stats.tokens = 0
    stats.updates = 0
    stats.started = time.perf_counter()
    return row
