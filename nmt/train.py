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

# long: fit's three parts (start, loop, finish) and their helpers, read top to bottom.

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nmt.average import write_average
from nmt.batching import collate, epoch_rows
from nmt.checkpoint import load_checkpoint
from nmt.config import Config
from nmt.data import Prepared, prepare
from nmt.files import atomic_write
from nmt.report import Log, Reporter, Stats
from nmt.run_dir import (
    AVERAGED_NAME,
    BEST_NAME,
    RunFiles,
    point_latest_at,
    step_checkpoints,
    step_of,
)
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
from nmt.shortlist import Shortlist, build_for
from nmt.step import update
from nmt.stopping import check_bad_steps, outside_reason, stop_reason
from nmt.train_state import Position, TrainState, check_resumable
from nmt.validation import attention_of, validate

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
    """Train the model `cfg` describes; returns where training ended and why.

    Start (claim the run directory, load what to resume, prepare the data, build the model),
    loop (updates until a stop reason, validating and saving on the way), finish (a last
    validation, the average of the last checkpoints, `runs/latest`)."""
    ctx = init_distributed(cfg.train.device, cfg.train.dist_timeout_minutes)
    log = log if ctx.is_main else _quiet
    try:
        with StopSignals(log) as signals:
            run = _start(cfg, ctx, signals, resume=resume, overwrite=overwrite, log=log)
            try:
                stopped_by, finished_before = _loop(run)
                if stopped_by == signals.name:
                    return _stopped_by_signal(run, config_path)
                _finish(run, stopped_by, finished_before)
            finally:
                run.reporter.close()
            return _farewell(run, stopped_by)
    finally:
        shutdown_distributed(ctx)


def _quiet(_: str) -> None:
    pass


@dataclass
class _Run:
    """One invocation of training: what it was given and built, and where it stands."""

    cfg: Config
    ctx: Distributed
    signals: StopSignals
    log: Log
    files: RunFiles
    prepared: Prepared
    ts: TrainState
    net: nn.Module  # the model, or DDP around it
    reporter: Reporter
    stats: Stats
    batches_of: Callable[[int], list[list[int]]]  # an epoch's batches (rows), this rank's
    resumed: bool
    started: float = field(default_factory=lambda: time.monotonic())  # read when made
    last_saved: float = field(default_factory=lambda: time.monotonic())
    saved_at: int | None = None  # the step last.pt holds
    validated_at: int = -1

    def minutes(self) -> float:
        return (time.monotonic() - self.started) / 60


def _start(
    cfg: Config,
    ctx: Distributed,
    signals: StopSignals,
    *,
    resume: bool,
    overwrite: bool,
    log: Log,
) -> _Run:
    """Claim the run directory, read the checkpoint to resume, prepare the data and build
    (or restore) model, optimizer and schedule."""
    tc = cfg.train
    device = resolve_device(tc.device, ctx.local_rank, distributed=ctx.enabled)
    precision = resolve_precision(tc.precision, device)
    configure_device(device, tc.threads)
    files = RunFiles(cfg.run_dir, tc.keep_last)
    saved = _claim(cfg, ctx, files, resume=resume, overwrite=overwrite, log=log)
    seed_everything(tc.seed)
    prepared = _prepare(cfg, ctx, log)
    train = prepared.train
    src_lens = [len(s) for s in train.src_ids]
    tgt_lens = [len(t) for t in train.tgt_ids]

    def batches_of(epoch: int) -> list[list[int]]:
        return epoch_rows(src_lens, tgt_lens, tc, epoch, rank=ctx.rank, world=ctx.world)

    updates_per_epoch = math.ceil(len(batches_of(0)) / tc.accum_steps)
    total_steps = tc.max_steps or (tc.max_epochs * updates_per_epoch if tc.max_epochs else None)
    ts = TrainState.build(cfg, prepared.tokenizer, device, precision, total_steps)
    if ctx.is_main:  # what rank 0's checkpoints carry for decoding
        ts.shortlist = _shortlist(prepared, log)
    if saved is not None:
        ts.restore(saved)
        log(f"resuming {cfg.run_dir} at step {ts.pos.step} (epoch {ts.pos.epoch + 1})")
    net: nn.Module = ts.model
    if ctx.enabled:
        # device_ids=None: the batches are on the device already; with device_ids DDP would
        # move src_lens (CPU, for packing) to the GPU and the model would copy it back.
        net = nn.parallel.DistributedDataParallel(ts.model, device_ids=None)
        if not ctx.is_main:  # each rank its own dropout masks
            torch.manual_seed(rank_seed(tc.seed, ctx.rank, ts.pos.step))
    n_params = sum(p.numel() for p in ts.model.parameters())
    log(
        f"model: {n_params:,} parameters; device {device}, precision {precision}"
        + (f", {ctx.world} processes" if ctx.enabled else "")
    )
    if ts.smoothed is not None:
        log(
            f"exponential smoothing {tc.exponential_smoothing:g}: validation and the "
            "checkpoints hold the running average of the weights"
        )
    reporter = Reporter(cfg, total_steps, log, enabled=ctx.is_main, start_step=ts.pos.step)
    run = _Run(
        cfg, ctx, signals, log, files, prepared, ts, net, reporter, Stats(device), batches_of,
        resumed=saved is not None,
    )  # fmt: skip
    if saved is not None:  # a resumed run goes on before it validates again
        run.saved_at = run.validated_at = ts.pos.step
    return run


def _shortlist(prepared: Prepared, log: Log) -> Shortlist:
    """The vocabulary shortlist of the training data (`nmt.shortlist`), built in seconds."""
    started = time.perf_counter()
    found = build_for(prepared.tokenizer, prepared.train.src_ids, prepared.train.tgt_ids)
    log(
        f"shortlist: {found.frequent.numel()} frequent pieces and {found.table.size(1)} a "
        f"source piece, for decoding ({time.perf_counter() - started:.1f} s)"
    )
    return found


def _claim(
    cfg: Config, ctx: Distributed, files: RunFiles, *, resume: bool, overwrite: bool, log: Log
) -> dict[str, Any] | None:
    """Make the run directory ours (rank 0) and read the checkpoint to resume, if any."""
    # Known before claiming (which never makes one), and the same on every rank.
    has_checkpoint = resume and files.last.is_file()
    if ctx.is_main:
        files.claim(resume=resume, overwrite=overwrite)
        atomic_write(cfg.run_dir / "config.yaml", cfg.to_yaml().encode("utf-8"))
        if resume and not has_checkpoint:
            log(f"{cfg.run_dir}: no checkpoint yet (stopped before its first); starting over")
    ctx.barrier()
    saved = load_checkpoint(files.last) if has_checkpoint else None
    if saved is not None:
        check_resumable(cfg, saved, cfg.run_dir)
    return saved


def _prepare(cfg: Config, ctx: Distributed, log: Log) -> Prepared:
    """The tokenizer and tokenized splits: rank 0 makes them, the others read its cache."""
    if not ctx.is_main:
        ctx.barrier()  # rank 0 trains the tokenizer and fills the cache first
    prepared = prepare(cfg, log=log)
    if ctx.is_main:
        for line in prepared.report_lines():
            log(line)
        ctx.barrier()
    return prepared


def _loop(run: _Run) -> tuple[str, bool]:
    """Updates until a stop reason; returns it, and whether the run had stopped before this
    invocation began (a finished run, resumed, does nothing)."""
    pos, tc = run.ts.pos, run.cfg.train
    batches = run.batches_of(pos.epoch)
    if pos.batch_in_epoch >= len(batches):  # saved at the very end of an epoch
        pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
        batches = run.batches_of(pos.epoch)
    # Every stop condition is checked before an update: here for the first one, and at the
    # end of each update for the next one.
    stopped_by = stop_reason(pos, tc) or outside_reason(
        run.signals, tc, run.minutes(), run.ctx, run.ts.device
    )
    finished_before = bool(stopped_by) and run.resumed
    run.net.train()
    while not stopped_by:
        epoch = pos.epoch
        rows = batches[pos.batch_in_epoch : pos.batch_in_epoch + tc.accum_steps]
        _update(run, rows)
        end_of_epoch = pos.batch_in_epoch >= len(batches)
        if end_of_epoch:
            pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
            batches = run.batches_of(pos.epoch)
        stopped_by = _after_update(run, epoch, end_of_epoch)
    return stopped_by, finished_before


def _update(run: _Run, rows: list[list[int]]) -> None:
    """One update from a group of accumulated batches; its sums stay on the device."""
    ts, tc, train = run.ts, run.cfg.train, run.prepared.train
    group = [
        collate([train.src_ids[r] for r in b], [train.tgt_ids[r] for r in b], b).to(
            ts.device, non_blocking=True
        )
        for b in rows
    ]
    loss, grad_norm = update(
        run.net,
        group,
        optimizer=ts.optimizer,
        scaler=ts.scaler,
        device=ts.device,
        precision=ts.precision,
        label_smoothing=tc.label_smoothing,
        clip_norm=tc.clip_norm,
        world=run.ctx.world,
    )
    ts.schedule.step()
    ts.pos.step += 1
    if ts.smoothed is not None:
        ts.smoothed.update(ts.pos.step)
    ts.pos.batch_in_epoch += len(rows)
    run.stats.add(loss, grad_norm, sum(b.n_tgt_tokens for b in group))
    run.reporter.advance(ts.pos.step, ts.pos.epoch)


def _after_update(run: _Run, epoch: int, end_of_epoch: bool) -> str:
    """Log, validate and save when it is time; returns why to stop ("" = go on)."""
    pos, tc, ctx, signals = run.ts.pos, run.cfg.train, run.ctx, run.signals
    log_now = pos.step % tc.log_every == 0
    stopped_by = stop_reason(pos, tc)
    if not ctx.enabled or log_now:  # under DDP agreeing costs a sync: log steps only
        stopped_by = stopped_by or outside_reason(signals, tc, run.minutes(), ctx, run.ts.device)
    by_signal = bool(stopped_by) and stopped_by == signals.name  # agreed by all ranks
    validate_now = (stopped_by and not by_signal) or (
        pos.step % tc.valid_every == 0 if tc.valid_every else end_of_epoch
    )
    if log_now or validate_now:
        where = f"last.pt holds step {run.saved_at}" if run.saved_at is not None else "none saved"
        check_bad_steps(run.stats, pos, tc, where)
    if validate_now:
        _validate_and_save(run, epoch)
        run.validated_at = run.saved_at = pos.step
        run.last_saved = time.monotonic()
        stopped_by = stopped_by or stop_reason(pos, tc)  # early stopping
    elif log_now:
        run.reporter.record(_row(run.stats, pos, epoch, run.ts.schedule.lr))
    minutes_unsaved = (time.monotonic() - run.last_saved) / 60
    every = tc.save_every_minutes
    if every is not None and minutes_unsaved >= every and not by_signal:
        if ctx.is_main:  # last.pt only: best.pt and step-N.pt come with validation
            run.files.save_last(run.ts.checkpoint())
        run.saved_at, run.last_saved = pos.step, time.monotonic()
    if not ctx.enabled and not stopped_by and signals.received is not None:
        stopped_by = signals.name  # it came during validation: no update starts now
    return stopped_by


def _stopped_by_signal(run: _Run, config_path: str | None) -> FitResult:
    """Ctrl-C or SIGTERM: last.pt saved (rank 0), and how to go on."""
    pos, name = run.ts.pos, run.signals.name
    if run.ctx.is_main:
        run.files.save_last(run.ts.checkpoint())
        run.log(
            f"{name} at step {pos.step}: saved {run.files.last}. "
            f"Resume with: nmt train {config_path or 'CONFIG'} --resume"
        )
    return FitResult(run.files.dir, pos.step, pos.epoch, pos.best_score, name, run.signals.received)


def _finish(run: _Run, stopped_by: str, finished_before: bool) -> None:
    """The last validation (unless the last update had one) and the averaged checkpoint."""
    pos = run.ts.pos
    if finished_before:
        run.log(
            f"{run.files.dir}: already finished ({stopped_by} at step {pos.step}); nothing to do"
        )
    elif run.validated_at != pos.step:  # stopped before its first update
        _validate_and_save(run, pos.epoch)
    if run.cfg.train.average_last and run.ctx.is_main:
        _average_last(run)


def _farewell(run: _Run, stopped_by: str) -> FitResult:
    """`runs/latest` pointed at this run, and a last line on how it ended (rank 0)."""
    pos, cfg = run.ts.pos, run.cfg
    if run.ctx.is_main:
        not_linked = point_latest_at(cfg.run_dir) if cfg.run.link_latest else None
        if not_linked:
            run.log(f"warning: {not_linked}")
        best = f"{pos.best_score:.2f}" if pos.best_score is not None else "-"
        run.log(
            f"stopped by {stopped_by} at step {pos.step} ({pos.epoch} full epochs); "
            f"best {cfg.train.valid_metric}: {best}; checkpoints in {cfg.run_dir}"
        )
    return FitResult(cfg.run_dir, pos.step, pos.epoch, pos.best_score, stopped_by)


def _row(stats: Stats, pos: Position, epoch: int, lr: float) -> dict[str, Any]:
    """The metrics row of a log step (reads the device sums: the one sync)."""
    return stats.flush(step=pos.step, epoch=epoch, lr=lr, skipped=pos.skipped_steps)


def _validate_and_save(run: _Run, epoch: int) -> None:
    """Validate on rank 0 and share its score, so that every rank takes the same decisions
    (the plateau schedule's learning rate, the best score, early stopping); then rank 0
    records the row and saves last (and best) checkpoints. With a learning rate cut on rank 0
    alone, DDP would average gradients that each rank applies at its own rate, and the
    replicas would drift apart."""
    ts, ctx, reporter = run.ts, run.ctx, run.reporter
    pos, tc = ts.pos, ts.cfg.train
    row: dict[str, Any] = {}
    score = 0.0
    if ctx.is_main:
        row = _row(run.stats, pos, epoch, ts.schedule.lr)
        scores = validate(ts.evaluated, run.prepared, ts.cfg, ts.device, ts.precision)
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
        if len(run.prepared.valid.src_ids):
            sample = run.prepared.valid.src_ids[0]
            image = attention_of(ts.evaluated, sample, ts.cfg.decode, ts.device)
            reporter.attention_image(image, pos.step)
        run.files.save(ts.checkpoint(), step=pos.step, best=improved)


def _average_last(run: _Run) -> None:
    """Write averaged.pt, the mean of the last `train.average_last` step checkpoints, and
    validate it against the best single checkpoint: kept where it is at least as good (a run
    directory translates with it first), removed otherwise. Training is over: the model is
    reused."""
    ts, log, tc = run.ts, run.log, run.cfg.train
    paths = step_checkpoints(run.files.dir)[-tc.average_last :]
    path = run.files.dir / AVERAGED_NAME
    if len(paths) < 2:  # the mean of one checkpoint is that checkpoint: nothing to gain
        log(f"train.average_last: {len(paths)} step checkpoint(s), nothing to average")
        return
    averaged = write_average(paths, path)
    ts.model.load_state_dict(averaged["model"])
    scores = validate(ts.model, run.prepared, ts.cfg, ts.device, ts.precision)
    averaged_scores = {f"avg_{k}": v for k, v in scores.items()}
    run.reporter.record(
        {"step": ts.pos.step, "epoch": ts.pos.epoch, "averaged": len(paths), **averaged_scores}
    )
    steps = ", ".join(str(step_of(p)) for p in paths)
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
            f"({abs(best):.2f}): not kept, the run translates with {BEST_NAME}"
        )
    else:
        log(f"{path}: {said} (the run translates with it)")
