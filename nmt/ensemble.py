"""Ensembles: several models decoding as one, for greedy and beam search alike.

`Ensemble` offers what the searches use of a model (`encode`, `init_state`, `step` and the
`select` of what those return) and holds one of each per model. At every step each model
gives its log-probabilities over the shared target vocabulary; the ensemble returns their
mean. The searches normalise what `step` returns, so the distribution decoded is the
renormalised geometric mean of the models' distributions (a product of experts: a token
that any model finds very unlikely stays unlikely). The attention shown is the mean of the
models' attention.

The models must read the same source pieces and write the same target pieces: they are
checked to share the tokenizer (`check_compatible`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.model import DecoderState, Encoded, Seq2Seq
    from nmt.tokenizer import Tokenizer


@dataclass
class EnsembleEncoded:
    """One `Encoded` per model."""

    parts: list[Encoded]

    def select(self, index: Tensor) -> EnsembleEncoded:
        return EnsembleEncoded([p.select(index) for p in self.parts])

    def beams(self, k: int) -> EnsembleEncoded:
        return EnsembleEncoded([p.beams(k) for p in self.parts])


@dataclass
class EnsembleState:
    """One `DecoderState` per model."""

    parts: list[DecoderState]

    def select(self, index: Tensor) -> EnsembleState:
        return EnsembleState([p.select(index) for p in self.parts])


class Ensemble:
    """Models decoding together; each is used as it is (eval mode, its own device)."""

    def __init__(self, models: Sequence[Seq2Seq]) -> None:
        if len(models) < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {len(models)}")
        self.models = list(models)

    def encode(self, src: Tensor, src_lens: Tensor) -> EnsembleEncoded:
        return EnsembleEncoded([m.encode(src, src_lens) for m in self.models])

    def init_state(self, enc: EnsembleEncoded) -> EnsembleState:
        return EnsembleState([m.init_state(e) for m, e in zip(self.models, enc.parts, strict=True)])

    def step(
        self, prev: Tensor, state: EnsembleState, enc: EnsembleEncoded
    ) -> tuple[Tensor, EnsembleState, Tensor]:
        """prev (B,) -> mean log-probabilities (B, V) float32, new states, mean attention (B, S)."""
        log_probs, states, attention = [], [], []
        for model, s, e in zip(self.models, state.parts, enc.parts, strict=True):
            logits, s_next, attn = model.step(prev, s, e)  # (B, V), _, (B, S)
            log_probs.append(logits.float().log_softmax(dim=-1))
            states.append(s_next)
            attention.append(attn.float())
        mean_lp = torch.stack(log_probs).mean(dim=0)  # (B, V)
        mean_attn = torch.stack(attention).mean(dim=0)  # (B, S)
        return mean_lp, EnsembleState(states), mean_attn


def check_compatible(tokenizers: Sequence[Tokenizer], paths: Sequence[Path]) -> None:
    """Refuse models that do not share their vocabularies: the first one that differs from
    the first model's is named, with the side."""
    first = tokenizers[0]
    first_tgt = first.tgt_pieces(list(range(first.tgt_vocab_size)))
    for tok, path in zip(tokenizers[1:], paths[1:], strict=True):
        if tok.tgt_pieces(list(range(tok.tgt_vocab_size))) != first_tgt:
            raise NmtError(
                f"--model {path}: its target vocabulary differs from {paths[0]}'s; an ensemble "
                "averages probabilities of the same target pieces (train with one tokenizer)"
            )
        if tok.to_bytes() != first.to_bytes():
            raise NmtError(
                f"--model {path}: its source tokenizer differs from {paths[0]}'s; ensemble "
                "members must read the same source pieces (train with one tokenizer)"
            )
