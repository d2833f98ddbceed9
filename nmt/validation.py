"""Validation during training: loss, perplexity and greedy BLEU on the valid split, and
the attention of one validation sentence for TensorBoard."""

from __future__ import annotations

import math

import torch

from nmt.batching import collate, make_batches
from nmt.config import Config, DecodeConfig
from nmt.data import Prepared
from nmt.evaluate import bleu
from nmt.model import Seq2Seq
from nmt.runtime import Precision, autocast
from nmt.search import decode
from nmt.step import token_loss


@torch.inference_mode()
def validate(
    model: Seq2Seq,
    prepared: Prepared,
    cfg: Config,
    device: torch.device,
    precision: Precision,
) -> dict[str, float]:
    """Validation loss, perplexity (without label smoothing) and greedy BLEU; with several
    valid splits, BLEU of each too (`val_bleu/<name>`)."""
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
            out = model(batch.src, batch.src_lens, batch.tgt_in)
            loss += token_loss(out, batch.tgt_out, 0.0)
            result = decode(model, batch.src, batch.src_lens, cfg.decode, beam=1)
        tokens += batch.n_tgt_tokens
        texts = prepared.tokenizer.decode_tgt([h[0].tokens for h in result.hypotheses])
        for r, text in zip(batch.index.tolist(), texts, strict=True):
            hyps[r] = text
    model.train()
    val_loss = loss.item() / max(tokens, 1)
    scores = {
        "val_loss": val_loss,
        "val_ppl": math.exp(min(val_loss, 50.0)),
        "val_bleu": bleu(hyps, split.tgt_text).score,  # all valid splits together: stopping
    }
    if len(prepared.valid_parts) > 1:  # and each corpus's own
        for name, (a, b) in prepared.valid_parts.items():
            scores[f"val_bleu/{name}"] = bleu(hyps[a:b], split.tgt_text[a:b]).score
    return scores


@torch.inference_mode()
def attention_of(
    model: Seq2Seq, src_ids: list[int], settings: DecodeConfig, device: torch.device
) -> torch.Tensor:
    """Greedy attention (T, S) for one sentence, for the TensorBoard image."""
    batch = collate([src_ids], None, [0]).to(device)
    model.eval()
    result = decode(model, batch.src, batch.src_lens, settings, beam=1)
    model.train()
    return result.hypotheses[0][0].attention.float().cpu()
