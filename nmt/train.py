"""Training: `fit(cfg)` runs one readable loop from a config to checkpoints.

The loop: batches bucketed by length (reshuffled each epoch, reproducible from the seed);
autocast for the forward pass and loss; the GradScaler for fp16 (`unscale_` before the
clip); gradient accumulation normalised by the tokens of the whole update; validation
(loss, perplexity, greedy BLEU) with best/last checkpoints; early stopping; metrics to
`metrics.jsonl` and TensorBoard. Nothing in a step forces a host-device sync: the loss,
token counts and gradient norm stay on the device until a logging step reads them.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nmt.batching import Batch, collate, epoch_rows, make_batches
from nmt.checkpoint import RunFiles, load_checkpoint, point_latest_at, save_checkpoint
from nmt.config import Config, config_from_dict
from nmt.data import Prepared, prepare
from nmt.errors import NmtError
from nmt.evaluate import bleu
from nmt.model import Seq2Seq, build_model
from nmt.optim import Schedule, build_optimizer
from nmt.report import Reporter
from nmt.runtime import (
    Distributed,
    Precision,
    autocast,
    configure_device,
    init_distributed,
    resolve_device,
    resolve_precision,
    seed_everything,
    shutdown_distributed,
)
from nmt.search import greedy
from nmt.tokenizer import PAD_ID

Log = Callable[[str], None]


def token_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Summed cross entropy over the non-pad target tokens, computed in fp32.

    logits (B, T, V) in any dtype, target (B, T) -> scalar (sum, not mean: the caller
    divides by the tokens of the whole update so accumulation equals one large batch).
    """
    return F.cross_entropy(
        logits.float().flatten(0, 1),  # (B*T, V)
        target.flatten(),
        ignore_index=PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


@dataclass
class Position:
    """Where training stands; everything needed to continue exactly."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # this rank's batches of `epoch` already consumed
    best_score: float | None = None
    bad_validations: int = 0  # validations since the best one, for early stopping
    skipped_steps: int = 0  # fp16 updates skipped for inf/NaN gradients


class Stats:
    """Running sums between two log lines, kept on the device (no sync per step)."""

    def __init__(self, device: torch.device) -> None:
        zero = torch.zeros((), device=device)
        self.loss = zero.clone()
        self.grad_norm = zero.clone()
        self.skips = zero.clone()  # fp16 updates skipped since the last read
        self.run_of_skips = zero.clone()  # ... in a row, up to now
        self.most_skips = zero.clone()  # longest such run since the last read
        self.tokens = 0
        self.updates = 0
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor, tokens: int) -> None:
        # A non-finite norm is exactly an update the fp16 GradScaler skipped.
        finite = torch.isfinite(grad_norm)
        self.loss += loss
        self.grad_norm += torch.where(finite, grad_norm, 0.0)
        self.skips += ~finite
        self.run_of_skips = (self.run_of_skips + 1) * ~finite
        torch.maximum(self.most_skips, self.run_of_skips, out=self.most_skips)
        self.tokens += tokens
        self.updates += 1


def update(
    model: nn.Module,
    group: Sequence[Batch],
    *,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    device: torch.device,
    precision: Precision,
    label_smoothing: float,
    clip_norm: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer update over `group` (accumulated micro-batches).

    Returns (summed loss, gradient norm) as device tensors. Each micro-batch's loss is
    divided by the target tokens of the whole group, so the update equals that of one
    batch holding all of them. Under DDP, gradients are all-reduced on the last one only.
    """
    total_tokens = sum(b.n_tgt_tokens for b in group)
    loss_sum = torch.zeros((), device=device)
    for i, batch in enumerate(group):
        last = i == len(group) - 1
        no_sync = getattr(model, "no_sync", None)  # DDP: all-reduce once, after the last
        sync = nullcontext() if last or no_sync is None else no_sync()
        with sync:
            with autocast(device, precision):
                logits, _ = model(batch.src, batch.src_lens, batch.tgt_in)
                loss = token_loss(logits, batch.tgt_out, label_smoothing)
            scaler.scale(loss / total_tokens).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    grad_norm = nn.utils.clip_grad_norm_(
        model.parameters(), clip_norm if clip_norm is not None else math.inf
    )
    scaler.step(optimizer)  # skips the step when fp16 gradients hold inf/NaN
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


@torch.inference_mode()
def validate(
    model: Seq2Seq,
    prepared: Prepared,
    cfg: Config,
    device: torch.device,
    precision: Precision,
) -> dict[str, float]:
    """Validation loss, perplexity (without label smoothing) and greedy BLEU."""
    split = prepared.valid
    model.eval()
    loss = torch.zeros((), device=device)
    tokens = 0
    hyps: list[str] = [""] * len(split.src_ids)
    for rows in make_batches(
        [len(s) for s in split.src_ids],
        [len(t) for t in split.tgt_ids],
        batch_size=cfg.decode.batch_size,
        batch_tokens=None,
        shuffle=False,
        seed=0,
        epoch=0,
    ):
        batch = collate(
            [split.src_ids[r] for r in rows], [split.tgt_ids[r] for r in rows], rows
        ).to(device)
        with autocast(device, precision):
            logits, _ = model(batch.src, batch.src_lens, batch.tgt_in)
            loss += token_loss(logits, batch.tgt_out, 0.0)
            result = greedy(
                model,
                batch.src,
                batch.src_lens,
                max_len_ratio=cfg.decode.max_len_ratio,
                max_len_const=cfg.decode.max_len_const,
                min_len=0,
            )
        tokens += batch.n_tgt_tokens
        texts = prepared.tokenizer.decode_tgt([h[0].tokens for h in result.hypotheses])
        for r, text in zip(rows, texts, strict=True):
            hyps[r] = text
    model.train()
    val_loss = loss.item() / max(tokens, 1)
    return {
        "val_loss": val_loss,
        "val_ppl": math.exp(min(val_loss, 50.0)),
        "val_bleu": bleu(hyps, split.tgt_text).score,
    }


def _check_resumable(cfg: Config, saved: dict[str, Any], run_dir: Path) -> None:
    """Resuming may change how training goes on (lr, steps, ...), not what is trained."""
    old = config_from_dict(saved["config"])
    for section in ("model", "tokenizer", "data"):
        if getattr(old, section) != getattr(cfg, section):
            a, b = getattr(old, section).__dict__, getattr(cfg, section).__dict__
            diffs = [f"{section}.{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k]]
            raise NmtError(
                f"{run_dir}: cannot resume with a different {section} config "
                f"({'; '.join(diffs)}); use another run.dir or --overwrite"
            )


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


@dataclass
class FitResult:
    run_dir: Path
    step: int
    epoch: int
    best_score: float | None
    stopped_by: str


def fit(
    cfg: Config,
    *,
    resume: bool = False,
    overwrite: bool = False,
    log: Log = print,
    config_path: str | None = None,
) -> FitResult:
    """Train the model `cfg` describes; returns where training ended and why."""
    ctx = init_distributed(cfg.train.device)
    try:
        return _fit(cfg, ctx, resume=resume, overwrite=overwrite, log=log, config_path=config_path)
    finally:
        shutdown_distributed(ctx)


def _fit(
    cfg: Config,
    ctx: Distributed,
    *,
    resume: bool,
    overwrite: bool,
    log: Log,
    config_path: str | None,
) -> FitResult:
    tc = cfg.train
    device = resolve_device(tc.device, ctx.local_rank)
    precision = resolve_precision(tc.precision, device)
    configure_device(device, tc.threads)
    run = RunFiles(cfg.run_dir, tc.keep_last)
    if ctx.is_main:
        run.claim(resume=resume, overwrite=overwrite)
        (cfg.run_dir / "config.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
    ctx.barrier()
    saved = load_checkpoint(cfg.run_dir / "last.pt") if resume else None
    if saved is not None:
        _check_resumable(cfg, saved, cfg.run_dir)
    seed_everything(tc.seed)

    if not ctx.is_main:
        ctx.barrier()  # rank 0 trains the tokenizer and fills the cache first
    prepared = prepare(cfg, log=log if ctx.is_main else (lambda _: None))
    if ctx.is_main:
        for line in prepared.report_lines():
            log(line)
        ctx.barrier()
    tokenizer = prepared.tokenizer

    model = build_model(
        cfg.model,
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        shared_vocab=tokenizer.joint,
    ).to(device)
    net: nn.Module = model
    if ctx.enabled:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = build_optimizer(tc, model.parameters())
    train = prepared.train
    src_lens = [len(s) for s in train.src_ids]
    tgt_lens = [len(t) for t in train.tgt_ids]

    def epoch_batches(epoch: int) -> list[list[int]]:
        return epoch_rows(src_lens, tgt_lens, tc, epoch, rank=ctx.rank, world=ctx.world)

    updates_per_epoch = math.ceil(len(epoch_batches(0)) / tc.accum_steps)
    total_steps = tc.max_steps or (tc.max_epochs * updates_per_epoch if tc.max_epochs else None)
    schedule = Schedule(tc, optimizer, total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    pos = Position()
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        scaler.load_state_dict(saved["scaler"])
        pos = Position(**saved["position"])
        _set_rng_state(saved["rng"], device)
        log(f"resuming {cfg.run_dir} at step {pos.step} (epoch {pos.epoch + 1})")
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"model: {n_params:,} parameters; device {device}, precision {precision}"
        + (f", {ctx.world} processes" if ctx.enabled else "")
    )

    def state() -> dict[str, Any]:
        return {
            "config": cfg.to_dict(),
            "tokenizer": tokenizer.to_bytes(),
            "vocab": {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size},
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(),
            "position": pos.__dict__.copy(),
            "rng": _rng_state(device),
            "precision": precision,
        }

    reporter = Reporter(cfg, total_steps, log, enabled=ctx.is_main, start_step=pos.step)
    stats = Stats(device)
    started = time.monotonic()
    stopped_by = ""
    sample = prepared.valid.src_ids[0] if len(prepared.valid.src_ids) else None
    validated_at = -1

    def validate_and_save() -> bool:
        """Validate (rank 0), save checkpoints; True when early stopping says stop."""
        nonlocal validated_at
        validated_at = pos.step
        stop = torch.zeros((), dtype=torch.long, device=device)  # NCCL broadcasts GPU tensors
        if ctx.is_main:
            row = _flush(stats, pos, schedule.lr)
            scores = validate(model, prepared, cfg, device, precision)
            row.update(scores)
            score = scores["val_bleu"] if tc.valid_metric == "bleu" else -scores["val_loss"]
            schedule.validated(score)
            improved = pos.best_score is None or score > pos.best_score
            if improved:
                pos.best_score, pos.bad_validations = score, 0
            else:
                pos.bad_validations += 1
            reporter.record(row)
            if sample is not None:
                reporter.attention_image(_attention_of(model, sample, device), pos.step)
            run.save(state(), step=pos.step, best=improved)
            if tc.patience and pos.bad_validations >= tc.patience:
                stop.fill_(1)
        if ctx.enabled:
            torch.distributed.broadcast(stop, src=0)
        return bool(stop.item())

    def out_of_time() -> bool:
        """The wall-clock budget, decided by rank 0 so that every rank stops together."""
        if tc.max_minutes is None:
            return False
        over = torch.tensor(time.monotonic() - started > tc.max_minutes * 60, device=device)
        if ctx.enabled:
            torch.distributed.broadcast(over, src=0)
        return bool(over.item())

    def check_skipped_steps() -> None:
        """fp16: count updates the scaler skipped; stop when too many come in a row."""
        if precision != "fp16":
            return
        most = int(stats.most_skips.item())
        pos.skipped_steps += int(stats.skips.item())
        stats.skips.zero_()
        stats.most_skips.zero_()
        if most >= tc.max_skipped_steps:
            raise NmtError(
                f"{most} fp16 updates in a row had inf/NaN gradients and were skipped: "
                "lower train.lr, or use train.precision bf16 or fp32"
            )

    net.train()
    try:
        while not stopped_by:
            if tc.max_epochs and pos.epoch >= tc.max_epochs:
                stopped_by = "max_epochs"
                break
            batches = epoch_batches(pos.epoch)
            groups = [
                batches[i : i + tc.accum_steps] for i in range(0, len(batches), tc.accum_steps)
            ]
            todo = groups[pos.batch_in_epoch // tc.accum_steps :]
            for k, group_rows in enumerate(todo):
                group = [
                    collate(
                        [train.src_ids[r] for r in rows], [train.tgt_ids[r] for r in rows], rows
                    ).to(device, non_blocking=True)
                    for rows in group_rows
                ]
                loss, grad_norm = update(
                    net,
                    group,
                    optimizer=optimizer,
                    scaler=scaler,
                    device=device,
                    precision=precision,
                    label_smoothing=tc.label_smoothing,
                    clip_norm=tc.clip_norm,
                )
                schedule.step()
                pos.step += 1
                pos.batch_in_epoch += len(group)
                stats.add(loss, grad_norm, sum(b.n_tgt_tokens for b in group))
                reporter.advance(pos.step, pos.epoch)
                log_now = pos.step % tc.log_every == 0
                if tc.max_steps and pos.step >= tc.max_steps:
                    stopped_by = "max_steps"
                if log_now and out_of_time():
                    stopped_by = stopped_by or "max_minutes"
                validate_now = bool(
                    stopped_by
                    or (tc.valid_every and pos.step % tc.valid_every == 0)
                    or (not tc.valid_every and k == len(todo) - 1)
                )
                if log_now or validate_now:
                    check_skipped_steps()
                if log_now and not validate_now:  # a validation row carries the train figures
                    reporter.record(_flush(stats, pos, schedule.lr))
                if validate_now and validate_and_save():
                    stopped_by = stopped_by or "early stopping"
                if stopped_by:
                    break
            else:
                pos.epoch += 1
                pos.batch_in_epoch = 0
        if validated_at != pos.step:
            validate_and_save()
    except KeyboardInterrupt:
        if ctx.is_main:
            reporter.close()
            save_checkpoint(state(), cfg.run_dir / "last.pt")
            where = config_path or "CONFIG"
            log(
                f"interrupted at step {pos.step}; saved {cfg.run_dir / 'last.pt'}. "
                f"Resume with: nmt train {where} --resume"
            )
        raise
    reporter.close()
    if ctx.is_main:
        point_latest_at(cfg.run_dir)
        best = f"{pos.best_score:.2f}" if pos.best_score is not None else "-"
        log(
            f"stopped by {stopped_by} at step {pos.step} ({pos.epoch} full epochs); "
            f"best {tc.valid_metric}: {best}; checkpoints in {cfg.run_dir}"
        )
    return FitResult(cfg.run_dir, pos.step, pos.epoch, pos.best_score, stopped_by)


def _flush(stats: Stats, pos: Position, lr: float) -> dict[str, Any]:
    """Read the device-side sums (the one sync) into a metrics row and reset them."""
    elapsed = time.perf_counter() - stats.started
    row: dict[str, Any] = {"step": pos.step, "epoch": pos.epoch, "lr": lr}
    if stats.updates:  # none when a resumed run validates before its first update
        row["loss"] = stats.loss.item() / max(stats.tokens, 1)
        row["tokens_per_s"] = stats.tokens / elapsed if elapsed > 0 else 0.0
        row["grad_norm"] = stats.grad_norm.item() / stats.updates
    if pos.skipped_steps:
        row["skipped_steps"] = pos.skipped_steps
    stats.loss.zero_()
    stats.grad_norm.zero_()
    stats.tokens = 0
    stats.updates = 0
    stats.started = time.perf_counter()
    return row


@torch.inference_mode()
def _attention_of(model: Seq2Seq, src_ids: list[int], device: torch.device) -> torch.Tensor:
    """Greedy attention (T, S) for one sentence, for the TensorBoard image."""
    batch = collate([src_ids], None, [0]).to(device)
    model.eval()
    result = greedy(
        model, batch.src, batch.src_lens, max_len_ratio=2.0, max_len_const=10, min_len=0
    )
    model.train()
    return result.hypotheses[0][0].attention.float().cpu()
