"""Batches: length-bucketed row groups, reproducible per epoch, padded into tensors.

Torch and NumPy only (no `datasets`), so translating does not pay for the data stack.
Shape legend: B batch, S source length (with EOS), T target length (with BOS or EOS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt.config import TrainConfig
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """A padded batch of sentence pairs, ready for the model."""

    src: Tensor  # (B, S) int64, source ids + [EOS], padded with PAD_ID
    src_lens: Tensor  # (B,) int64, on CPU (pack_padded_sequence needs CPU lengths), descending
    tgt_in: Tensor  # (B, T) int64, [BOS] + target ids, padded; (B, 0) without targets
    tgt_out: Tensor  # (B, T) int64, target ids + [EOS], padded; (B, 0) without targets
    index: Tensor  # (B,) int64 on CPU: the row number (as given) of each row, in batch order
    n_tgt_tokens: int  # non-pad target tokens

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on `device`; `src_lens` and `index` (host bookkeeping) stay on the
        CPU. To a GPU with `non_blocking`, the tensors are pinned first so the copy really is
        asynchronous."""
        pin = non_blocking and torch.device(device).type == "cuda"

        def move(t: Tensor) -> Tensor:
            return (t.pin_memory() if pin else t).to(device, non_blocking=non_blocking)

        return dataclasses.replace(
            self,
            src=move(self.src),
            tgt_in=move(self.tgt_in),
            tgt_out=move(self.tgt_out),
        )


def collate(
    rows_src: list[list[int]], rows_tgt: list[list[int]] | None, index: Sequence[int]
) -> Batch:
    """Pad rows of ids into a Batch: EOS after each source, BOS/EOS around each target.

    Rows are put in order of decreasing source length (stable; `index` says where each came
    from), so that the encoder packs them with `enforce_sorted=True`: unsorted packing
    copies its sort indices host -> device and back, two blocking copies per batch on a GPU.
    """
    order = sorted(range(len(rows_src)), key=lambda i: -len(rows_src[i]))
    if order != list(range(len(order))):
        rows_src = [rows_src[i] for i in order]
        rows_tgt = None if rows_tgt is None else [rows_tgt[i] for i in order]
        index = [index[i] for i in order]
    src = [[*r, EOS_ID] for r in rows_src]
    src_lens = torch.tensor([len(r) for r in src], dtype=torch.long)
    if rows_tgt is None:
        tgt_in = tgt_out = torch.zeros((len(src), 0), dtype=torch.long)
        n_tgt = 0
    else:
        tgt_in = _pad([[BOS_ID, *r] for r in rows_tgt])
        tgt_out = _pad([[*r, EOS_ID] for r in rows_tgt])
        n_tgt = sum(len(r) + 1 for r in rows_tgt)
    return Batch(
        src=_pad(src),
        src_lens=src_lens,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        index=torch.tensor(list(index), dtype=torch.long),
        n_tgt_tokens=n_tgt,
    )


def _pad(rows: list[list[int]]) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows], dtype=torch.long)


def make_batches(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    *,
    batch_size: int,
    batch_tokens: int | None,
    shuffle: bool,
    seed: int,
    epoch: int,
) -> list[list[int]]:
    """Row numbers grouped into batches of similar lengths, to waste little on padding.

    Rows are sorted by (source length, target length), cut into batches of at most
    `batch_size` rows and, when set, `batch_tokens` padded tokens on either side (a row
    longer than that gets a batch of its own). With `shuffle`, ties are broken at random
    and the batch order is shuffled, both from (seed, epoch) alone: the same arguments
    give the same batches, which is how a resumed run finds its place in an epoch.
    """
    n = len(src_lens)
    if len(tgt_lens) != n:
        raise ValueError(f"make_batches: {n} source lengths but {len(tgt_lens)} target lengths")
    if batch_size < 1 or (batch_tokens is not None and batch_tokens < 1):
        raise ValueError("make_batches: batch_size and batch_tokens must be positive")
    src = np.asarray(src_lens, dtype=np.int64) + 1  # + EOS (target: + BOS or EOS)
    tgt = np.asarray(tgt_lens, dtype=np.int64) + 1
    rng = np.random.default_rng([seed % 2**63, epoch])
    ties = rng.random(n) if shuffle else np.arange(n)
    order = np.lexsort((ties, tgt, src))  # last key sorts first
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order.tolist():
        width = max(longest, int(src[i]), int(tgt[i]))
        full = len(current) >= batch_size or (
            batch_tokens is not None and width * (len(current) + 1) > batch_tokens
        )
        if current and full:
            batches.append(current)
            current, width = [], max(int(src[i]), int(tgt[i]))
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches)).tolist()]
    return batches


def padding_fraction(
    batches: Sequence[Sequence[int]], src_lens: Sequence[int], tgt_lens: Sequence[int]
) -> float:
    """Share of pad tokens in the padded batches, source and target together."""
    real = padded = 0
    for rows in batches:
        s = [src_lens[i] + 1 for i in rows]
        t = [tgt_lens[i] + 1 for i in rows]
        real += sum(s) + sum(t)
        padded += len(rows) * (max(s) + max(t))
    return 1.0 - real / padded if padded else 0.0


def epoch_rows(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    train: TrainConfig,
    epoch: int,
    *,
    rank: int = 0,
    world: int = 1,
) -> list[list[int]]:
    """The training batches (row numbers) of one epoch for process `rank` of `world`.

    Every rank gets the same number of batches (the epoch is cut to a multiple of
    `world`, so DDP ranks step together); rank r takes batches r, r + world, ...
    """
    if not 0 <= rank < world:
        raise ValueError(f"epoch_rows: rank {rank} is not in 0..{world - 1}")
    batches = make_batches(
        src_lens,
        tgt_lens,
        batch_size=train.batch_size,
        batch_tokens=train.batch_tokens,
        shuffle=True,
        seed=train.seed,
        epoch=epoch,
    )
    usable = len(batches) - len(batches) % world
    return batches[rank:usable:world]
